//go:build arm64

package kernels

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

// TestVecNEONEdges: the NEON loops behind MulAdd, MulSet, Add, Scale and
// Max give their Go loops' bits on inputs with zeros of both signs,
// infinities, subnormals, huge values and NaN (opsEdges), at every length
// 1..200 (the NEON part and the Go tail). Max's NaN and ±0 cases are
// where a vector maximum could differ from Go's max.
func TestVecNEONEdges(t *testing.T) {
	if !useAVX2 {
		t.Skip("SLUICE_NOSIMD set")
	}
	r := rand.New(rand.NewPCG(97, 98))
	for n := 1; n <= 200; n++ {
		for _, edges := range []bool{false, true} {
			s, w, x := opsInput(r, n, 3, edges), opsInput(r, n, 3, edges), opsInput(r, n, 3, edges)

			want := append([]float32(nil), s...)
			for i := range want {
				want[i] += float32(w[i] * x[i])
			}
			got := guarded(s)
			MulAdd(got, w, x)
			compareBits(t, "MulAdd", n, got, want)
			checkGuard(t, "MulAdd", got)

			for i := range want {
				var z float32
				want[i] = z + float32(w[i]*x[i])
			}
			got = guarded(s)
			MulSet(got, w, x)
			compareBits(t, "MulSet", n, got, want)
			checkGuard(t, "MulSet", got)

			for i := range want {
				want[i] = s[i] + x[i]
			}
			got = guarded(s)
			Add(got, x)
			compareBits(t, "Add", n, got, want)
			checkGuard(t, "Add", got)

			a := w[0]
			for i := range want {
				want[i] = s[i] * a
			}
			got = guarded(s)
			Scale(got, a)
			compareBits(t, "Scale", n, got, want)
			checkGuard(t, "Scale", got)

			m := s[0]
			for _, v := range s {
				m = max(m, v)
			}
			if got := Max(s); !sameBits(got, m) {
				t.Fatalf("Max n=%d edges %v: %v (%#08x), Go %v (%#08x)", n, edges, got, math.Float32bits(got), m, math.Float32bits(m))
			}
		}
	}
	// Max over zeros of both signs is +0 wherever the +0 sits.
	for n := 8; n <= 24; n++ {
		for at := 0; at < n; at++ {
			z := make([]float32, n)
			for i := range z {
				z[i] = float32(math.Copysign(0, -1))
			}
			z[at] = 0
			if got := Max(z); math.Float32bits(got) != 0 {
				t.Fatalf("Max of -0s and one +0 at %d of %d: %#08x", at, n, math.Float32bits(got))
			}
		}
	}
}

// TestDotF32x4NEON: the four-row f32 dot gives dotF32's bits for each
// activation row, for lengths 16 to 320 and edge values, with activation
// rows and outputs spaced wider than needed.
func TestDotF32x4NEON(t *testing.T) {
	r := rand.New(rand.NewPCG(99, 100))
	for n := 16; n <= 320; n += 16 {
		for _, edges := range []bool{false, true} {
			xstride := n + 4*r.IntN(3)
			w, x := opsInput(r, n, 2, edges), opsInput(r, 4*xstride, 2, edges)
			out := make([]float32, 4*5)
			dotF32x4NEON(&w[0], &x[0], 4*xstride, n, &out[0], 4*5)
			for k := 0; k < 4; k++ {
				want := dotF32(w, x[k*xstride:k*xstride+n])
				if got := out[5*k]; !sameBits(got, want) {
					t.Fatalf("n %d edges %v row %d: %v, dotF32 %v", n, edges, k, got, want)
				}
			}
			for i, v := range out {
				if i%5 != 0 && v != 0 {
					t.Fatalf("n %d: wrote out[%d] between the results", n, i)
				}
			}
		}
	}
}

// TestReadNEON: the bandwidth reader sums its bytes as uint64 words, as
// readAVX2 does on amd64.
func TestReadNEON(t *testing.T) {
	r := rand.New(rand.NewPCG(101, 102))
	for _, blocks := range []int{1, 2, 7} {
		b := make([]byte, 256*blocks)
		for i := range b {
			b[i] = byte(r.IntN(256))
		}
		var want uint64
		for i := 0; i < len(b); i += 8 {
			want += binary.LittleEndian.Uint64(b[i:])
		}
		if got := readNEON(&b[0], blocks); got != want {
			t.Fatalf("%d blocks: %#x, want %#x", blocks, got, want)
		}
	}
}
