//go:build arm64

package kernels

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestQ4NEONIntegerPaths: the NEON q4 kernel gives dotQ4I8's bits with SDOT
// and with the SMULL/SMLAL fallback, on every group count up to 40, with
// random values and with every nibble 15 against activations of ±127 and
// -128 (the largest integer sums).
func TestQ4NEONIntegerPaths(t *testing.T) {
	r := rand.New(rand.NewPCG(81, 82))
	paths := []bool{false}
	if useSDOT {
		paths = append(paths, true)
	} else {
		t.Log("no SDOT on this CPU: only the fallback path runs")
	}
	for _, sdot := range paths {
		for ng := 1; ng <= 40; ng++ {
			for _, extreme := range []bool{false, true} {
				n := ng * 64
				q, x8 := make([]byte, n/2), make([]int8, n)
				for i := range q {
					q[i] = byte(r.IntN(256))
					if extreme {
						q[i] = 0xff
					}
				}
				for i := range x8 {
					x8[i] = int8(r.IntN(255) - 127)
					if extreme {
						x8[i] = [3]int8{127, -127, -128}[(i/64)%3]
					}
				}
				sc, bi, xs, xsum := randVec(r, ng), randVec(r, ng), randVec(r, ng), randVec(r, ng)
				got := dotQ4I8NEON(&q[0], &sc[0], &bi[0], &x8[0], &xs[0], &xsum[0], ng, sdot)
				want := dotQ4I8(q, sc, bi, x8, xs, xsum)
				if math.Float32bits(got) != math.Float32bits(want) {
					t.Fatalf("sdot %v groups %d extreme %v: %v, twin %v", sdot, ng, extreme, got, want)
				}
			}
		}
	}
}

// TestQuantizeRow8NEON: the NEON quantiser gives quantizeRow8Go's int8
// values and scales for 1 to 9 groups of normal values at scales from
// 1e-30 to 1e30 and of edge values (zeros of both signs, infinities,
// subnormals, NaN: the saturating and NaN conversions), all-zero groups
// included, writing nothing past the row.
func TestQuantizeRow8NEON(t *testing.T) {
	r := rand.New(rand.NewPCG(83, 84))
	for ng := 1; ng <= 9; ng++ {
		for _, sc := range []float64{1, 1e-30, 1e30} {
			for _, edges := range []bool{false, true} {
				x := opsInput(r, ng*64, sc, edges)
				if ng > 2 {
					clear(x[64:128])
				}
				want8, wants := make([]int8, ng*64), make([]float32, ng)
				quantizeRow8Go(want8, wants, x)
				got8, gots := make([]int8, ng*64+16), guarded(make([]float32, ng))
				for i := range got8 {
					got8[i] = 99
				}
				quantizeRow8NEON(&got8[0], &gots[0], &x[0], ng)
				for i, v := range want8 {
					if got8[i] != v {
						t.Fatalf("ng %d scale %g edges %v: x8[%d] = %d, Go %d (x %v, xs %v)", ng, sc, edges, i, got8[i], v, x[i], wants[i/64])
					}
				}
				for _, v := range got8[ng*64:] {
					if v != 99 {
						t.Fatalf("ng %d: wrote past x8", ng)
					}
				}
				compareBits(t, "quantizeRow8 xs", ng, gots, wants)
				checkGuard(t, "quantizeRow8 xs", gots)
			}
		}
	}
}
