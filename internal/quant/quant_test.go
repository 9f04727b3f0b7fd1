package quant

import (
	"math/rand/v2"
	"testing"
)

// TestUnpackLowFast checks the whole-byte paths against the general bit loop.
func TestUnpackLowFast(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, b := range []int{2, 3} {
		src := make([]byte, 64*b/8*5)
		for i := range src {
			src[i] = byte(r.IntN(256))
		}
		n := len(src) * 8 / b
		fast, slow := make([]uint8, n), make([]uint8, n)
		UnpackLow(fast, src, b)
		unpackLowBits(slow, src, b)
		for i := range fast {
			if fast[i] != slow[i] {
				t.Fatalf("b=%d value %d: fast %d, bit loop %d", b, i, fast[i], slow[i])
			}
		}
	}
}
