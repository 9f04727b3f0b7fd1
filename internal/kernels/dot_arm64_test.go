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
