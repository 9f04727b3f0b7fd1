package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/quant"
)

// q4Case is a q4 product with raw operands, so that tests can reach the
// extremes the quantisers rarely produce: nibbles 0 and 15, activations
// ±127, all-zero groups.
type q4Case struct {
	w          Mat
	x8         []int8
	xs, xsum   []float32
	rows, cols int
	nb         int
}

func newQ4Case(r *rand.Rand, rows, cols, nb int) *q4Case {
	ng := cols / format.GroupSize
	c := &q4Case{rows: rows, cols: cols, nb: nb}
	c.w = Mat{Rows: rows, Cols: cols, Kind: format.Q4,
		Q: make([]byte, rows*cols/2), Scales: make([]uint16, rows*ng), Biases: make([]uint16, rows*ng)}
	for i := range c.w.Q {
		switch r.IntN(8) {
		case 0:
			c.w.Q[i] = 0
		case 1:
			c.w.Q[i] = 0xff
		case 2:
			c.w.Q[i] = 0x0f
		default:
			c.w.Q[i] = byte(r.IntN(256))
		}
	}
	for i := range c.w.Scales {
		c.w.Scales[i] = quant.F16(float32(r.NormFloat64()) * 0.02)
		c.w.Biases[i] = quant.F16(float32(r.NormFloat64()) * 0.1)
	}
	c.x8 = make([]int8, nb*cols)
	for i := range c.x8 {
		switch r.IntN(6) {
		case 0:
			c.x8[i] = 127
		case 1:
			c.x8[i] = -127
		default:
			c.x8[i] = int8(r.IntN(255) - 127)
		}
	}
	c.xs, c.xsum = make([]float32, nb*ng), make([]float32, nb*ng)
	for i := range c.xs {
		c.xs[i] = float32(math.Abs(r.NormFloat64())) / 127
		c.xsum[i] = float32(r.NormFloat64()) * 8
	}
	// Whole zero groups on either side.
	if ng > 1 {
		clear(c.w.Q[:format.GroupSize/2])
		clear(c.x8[format.GroupSize : 2*format.GroupSize])
	}
	return c
}

// want is the Go twin's result for activation row b and weight row o.
func (c *q4Case) want(b, o int) float32 {
	C, ng := c.cols, c.cols/format.GroupSize
	return dotQ4I8(c.w.Q[o*C/2:(o+1)*C/2], c.w.sf()[o*ng:(o+1)*ng], c.w.bf()[o*ng:(o+1)*ng],
		c.x8[b*C:(b+1)*C], c.xs[b*ng:(b+1)*ng], c.xsum[b*ng:(b+1)*ng])
}

// run computes the product through matmulTask.Run split at the given
// boundaries, as the pool's threads would.
func (c *q4Case) run(splits ...int) []float32 {
	out := make([]float32, c.nb*c.rows)
	for i := range out {
		out[i] = float32(math.NaN())
	}
	t := matmulTask{out: out, xsum: c.xsum, xs: c.xs, x8: c.x8, w: &c.w, nb: c.nb}
	lo := 0
	for _, s := range append(splits, c.rows) {
		t.Run(lo, s)
		lo = s
	}
	return out
}

// q4Path is a kernel choice: the pure-Go twin, the AVX2 kernels, or the
// AVX-512 ones.
type q4Path struct {
	name       string
	avx2, vnni bool
}

// q4Paths are the kernel choices this machine can run, each to be
// bit-identical to the Go twin.
func q4Paths() []q4Path {
	paths := []q4Path{{"go", false, false}}
	if useAVX2 {
		paths = append(paths, q4Path{"avx2", true, false})
	}
	if useVNNI {
		paths = append(paths, q4Path{"avx512", true, true})
	}
	return paths
}

func withQ4Path(avx2, vnni bool, f func()) {
	a, v := useAVX2, useVNNI
	useAVX2, useVNNI = avx2, vnni
	defer func() { useAVX2, useVNNI = a, v }()
	f()
}

// TestQ4TileKernels: every q4 path gives the Go twin's bits, for every
// activation row count (the 8/4/2/1 blocks and their remainders), partial
// tiles at the end of a thread's part and of the matrix, and column counts
// below, at and above one chunk.
func TestQ4TileKernels(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	for _, p := range q4Paths() {
		for _, sh := range [][2]int{{16, 64}, {64, 256}, {37, 128}, {5, 64}, {256, 64}, {24, 192}, {40, 320}, {48, 512}, {33, 576}, {20, 1088}} {
			for _, nb := range []int{1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31} {
				rows, cols := sh[0], sh[1]
				c := newQ4Case(r, rows, cols, nb)
				var out []float32
				withQ4Path(p.avx2, p.vnni, func() { out = c.run(rows/3, rows/3+1, rows-rows/4) })
				for b := 0; b < nb; b++ {
					for o := 0; o < rows; o++ {
						got, want := out[b*rows+o], c.want(b, o)
						if math.Float32bits(got) != math.Float32bits(want) {
							t.Fatalf("%s [%d %d] nb %d: row %d out %d: %v, Go twin %v", p.name, rows, cols, nb, b, o, got, want)
						}
					}
				}
			}
		}
	}
}

// TestQ4TileExtremes saturates every group: all nibbles 15 against all
// activations +127 or -127, the largest int16 partial sums the AVX2
// kernels form (8·2·15·127 = 30480) and the largest group sums.
func TestQ4TileExtremes(t *testing.T) {
	r := rand.New(rand.NewPCG(47, 48))
	for _, p := range q4Paths() {
		for _, nb := range []int{1, 2, 5, 16} {
			c := newQ4Case(r, 40, 320, nb)
			for i := range c.w.Q {
				c.w.Q[i] = 0xff
			}
			for i := range c.x8 {
				c.x8[i] = 127
				if i/format.GroupSize%3 == 1 {
					c.x8[i] = -127
				}
			}
			var out []float32
			withQ4Path(p.avx2, p.vnni, func() { out = c.run(17) })
			for b := 0; b < nb; b++ {
				for o := 0; o < c.rows; o++ {
					if got, want := out[b*c.rows+o], c.want(b, o); math.Float32bits(got) != math.Float32bits(want) {
						t.Fatalf("%s nb %d: row %d out %d: %v, Go twin %v", p.name, nb, b, o, got, want)
					}
				}
			}
		}
	}
}

// TestQ4SingleRowKernel: dotQ4I8AVX2, the single-row AVX2 kernel, is the Go
// twin bit for bit.
func TestQ4SingleRowKernel(t *testing.T) {
	if !useAVX2 {
		t.Skip("no AVX2/FMA")
	}
	r := rand.New(rand.NewPCG(43, 44))
	for _, cols := range []int{64, 128, 256, 512, 1088} {
		c := newQ4Case(r, 9, cols, 3)
		ng := cols / format.GroupSize
		for b := 0; b < c.nb; b++ {
			for o := 0; o < c.rows; o++ {
				got := dotQ4I8AVX2(&c.w.Q[o*cols/2], &c.w.sf()[o*ng], &c.w.bf()[o*ng], &c.x8[b*cols], &c.xs[b*ng], &c.xsum[b*ng], ng)
				if want := c.want(b, o); math.Float32bits(got) != math.Float32bits(want) {
					t.Fatalf("cols %d row %d out %d: %v, Go twin %v", cols, b, o, got, want)
				}
			}
		}
	}
}

// TestQ4PathsQuantised runs every path on encoder-made weights and
// QuantizeRow8 activations through Scratch.MatMul (batch and alone).
func TestQ4PathsQuantised(t *testing.T) {
	r := rand.New(rand.NewPCG(45, 46))
	rows, cols, nb := 70, 320, 13
	m, _ := encodeMat(t, randVec(r, rows*cols), rows, cols, format.Q4)
	x := randVec(r, nb*cols)
	var ref []float32
	for _, p := range q4Paths() {
		var out, one []float32
		withQ4Path(p.avx2, p.vnni, func() {
			var sc Scratch
			out = make([]float32, nb*rows)
			sc.MatMul(out, &m, x, nb)
			one = make([]float32, rows)
			sc.MatMul(one, &m, x[(nb-1)*cols:], 1)
		})
		if ref == nil {
			ref = out
		}
		for i := range out {
			if math.Float32bits(out[i]) != math.Float32bits(ref[i]) {
				t.Fatalf("%s: out[%d] = %v, Go path %v", p.name, i, out[i], ref[i])
			}
		}
		for o := range one {
			if math.Float32bits(one[o]) != math.Float32bits(ref[(nb-1)*rows+o]) {
				t.Fatalf("%s: row alone out %d = %v, in batch %v", p.name, o, one[o], ref[(nb-1)*rows+o])
			}
		}
	}
}

// BenchmarkQ4Paths compares the q4 kernels on the shapes of the tiny test
// models: expert gate/up (64×256) and down (256×64) at the rows an expert
// sees in prefill, attention (512×256 and 256×512) at a 256-row chunk, and
// the LM head (4096×256) at one row, as in decode.
func BenchmarkQ4Paths(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	shapes := []struct{ rows, cols, nb int }{
		{64, 256, 16}, {256, 64, 16}, {64, 256, 2}, {64, 256, 3}, {64, 256, 4}, {256, 64, 2}, {256, 64, 3}, {256, 64, 4}, {4096, 256, 2}, {512, 256, 256}, {256, 512, 256}, {4096, 256, 1}, {64, 256, 1}, {256, 64, 1},
	}
	for _, sh := range shapes {
		m, _ := encodeMat(b, randVec(r, sh.rows*sh.cols), sh.rows, sh.cols, format.Q4)
		x := randVec(r, sh.nb*sh.cols)
		out := make([]float32, sh.nb*sh.rows)
		for _, p := range q4Paths()[1:] {
			b.Run(fmt.Sprintf("%dx%d/nb%d/%s", sh.rows, sh.cols, sh.nb, p.name), func(b *testing.B) {
				withQ4Path(p.avx2, p.vnni, func() {
					var sc Scratch
					for b.Loop() {
						sc.MatMul(out, &m, x, sh.nb)
					}
				})
				b.ReportMetric(float64(sh.rows*sh.cols*sh.nb)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GMAC/s")
			})
		}
	}
}

// q4RowsModes are the decode kernel variants this machine can run.
func q4RowsModes() []uint8 {
	modes := []uint8{0, q4RowsPrefetch}
	if useVNNI {
		modes = append(modes, q4RowsVNNI, q4RowsVNNI|q4RowsPrefetch, q4RowsVNNI|q4RowsPrefetch|q4RowsZMM,
			q4RowsVNNI|q4RowsPrefetch|q4RowsZMM|q4RowsPairs)
	}
	return modes
}

// TestQ4RowsModes: every variant of the decode kernel gives the Go twin's
// bits, for group counts odd and even, below, at and above one chunk, and
// several tiles.
func TestQ4RowsModes(t *testing.T) {
	if !useAVX2 {
		t.Skip("no AVX2/FMA")
	}
	r := rand.New(rand.NewPCG(47, 48))
	// 8192 columns are the most the 512-bit variant takes, 8256 more.
	for _, cols := range []int{64, 128, 192, 320, 512, 768, 1088, 2048, 8192, 8256} {
		for _, rows := range []int{8, 24} {
			c := newQ4Case(r, rows, cols, 2)
			ng := cols / format.GroupSize
			for _, mode := range q4RowsModes() {
				for b := 0; b < c.nb; b++ {
					out := make([]float32, rows)
					for i := range out {
						out[i] = float32(math.NaN())
					}
					q4Rows(&c.w.Q[0], cols/2, &c.w.Scales[0], &c.w.Biases[0], ng, rows, &c.x8[b*cols], &c.xs[b*ng], &c.xsum[b*ng], &out[0], mode, new([]float32))
					for o := range out {
						if want := c.want(b, o); math.Float32bits(out[o]) != math.Float32bits(want) {
							t.Fatalf("mode %d cols %d rows %d: out[%d][%d] = %v, Go twin %v", mode, cols, rows, b, o, out[o], want)
						}
					}
				}
			}
		}
	}
}
