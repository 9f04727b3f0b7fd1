package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/quant"
)

// TestWidenHalf: the SIMD widening gives quant.F16ToF32's bits for every
// half (NaNs included), at every length around its 8-wide steps.
func TestWidenHalf(t *testing.T) {
	src := make([]uint16, 1<<16+5)
	for i := range src {
		src[i] = uint16(i)
	}
	for _, n := range []int{0, 1, 7, 8, 9, 17, len(src)} {
		dst := make([]float32, n+1)
		dst[n] = 12345
		widenHalf(dst[:n], src[:n])
		for i := 0; i < n; i++ {
			if got, want := math.Float32bits(dst[i]), math.Float32bits(quant.F16ToF32(src[i])); got != want {
				t.Fatalf("n %d: half %#04x widened to %#08x, want %#08x", n, src[i], got, want)
			}
		}
		if dst[n] != 12345 {
			t.Fatalf("n %d: wrote past the end", n)
		}
	}
}

// TestWidenChunks: products whose rows take several widenings (a part of
// more rows than one room holds, tiles straddling the room's end) or a
// buffer larger than the room (rows of more than 256 groups) give the Go
// twin's bits on every path, for q4, and for q8 and q3 the single-row
// kernels' bits.
func TestWidenChunks(t *testing.T) {
	r := rand.New(rand.NewPCG(61, 62))
	shapes := [][2]int{{200, 2048}, {40, 9216}, {20, 16448}}
	for _, p := range q4Paths() {
		for _, sh := range shapes {
			for _, nb := range []int{1, 2, 5} {
				rows, cols := sh[0], sh[1]
				c := newQ4Case(r, rows, cols, nb)
				var out []float32
				withQ4Path(p.avx2, p.vnni, func() { out = c.run(rows/3, rows-rows/5) })
				for b := 0; b < nb; b++ {
					for o := 0; o < rows; o++ {
						if got, want := out[b*rows+o], c.want(b, o); math.Float32bits(got) != math.Float32bits(want) {
							t.Fatalf("%s [%d %d] nb %d: out[%d][%d] = %v, Go twin %v", p.name, rows, cols, nb, b, o, got, want)
						}
					}
				}
			}
		}
	}
	pool := NewPool(2)
	defer pool.Close()
	for _, k := range []format.Kind{format.Q8, format.Q3} {
		for _, sh := range shapes {
			t.Run(fmt.Sprintf("%s/%dx%d", k, sh[0], sh[1]), func(t *testing.T) {
				rows, cols := sh[0], sh[1]
				var m Mat
				if k == format.Q3 {
					m, _ = lowMats(r, rows, cols, 3)
				} else {
					m, _ = encodeMat(t, randVec(r, rows*cols), rows, cols, k)
				}
				x := randVec(r, 2*cols)
				out := make([]float32, 2*rows)
				pool.MatMul(out, &m, x, 2)
				ng := cols / format.GroupSize
				s, b := m.sf(), m.bf()
				for i := 0; i < 2; i++ {
					xi := x[i*cols : (i+1)*cols]
					xsum := make([]float32, ng)
					GroupSums(xsum, xi)
					x8, xs := make([]int8, cols), make([]float32, ng)
					QuantizeRow8(x8, xs, xi)
					for o := 0; o < rows; o++ {
						var want float32
						if k == format.Q3 {
							want = dotLowI8(m.Q[o*cols*3/8:(o+1)*cols*3/8], 3, s[o*ng:(o+1)*ng], b[o*ng:(o+1)*ng], x8, xs, xsum)
						} else {
							want = dotQ8(m.Q[o*cols:(o+1)*cols], s[o*ng:(o+1)*ng], b[o*ng:(o+1)*ng], xi, xsum)
						}
						if got := out[i*rows+o]; math.Float32bits(got) != math.Float32bits(want) {
							t.Fatalf("out[%d][%d] = %v, single-row %v", i, o, got, want)
						}
					}
				}
			})
		}
	}
}
