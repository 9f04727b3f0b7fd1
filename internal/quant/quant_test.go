package quant

import (
	"math/rand/v2"
	"testing"

	"github.com/sluicelm/sluice/internal/format"
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

// TestPackLowFast checks PackLow's whole-byte paths against the general
// bit loop, and that UnpackLow gives the values back.
func TestPackLowFast(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, b := range []int{2, 3} {
		q := make([]uint8, 64*5)
		for i := range q {
			q[i] = uint8(r.IntN(1 << b))
		}
		fast, slow := make([]byte, len(q)*b/8), make([]byte, len(q)*b/8)
		for i := range fast {
			fast[i] = 0xff // overwritten, not or-ed into
		}
		PackLow(fast, q, b)
		packLowBits(slow, q, b)
		if string(fast) != string(slow) {
			t.Fatalf("b=%d: fast path %x, bit loop %x", b, fast[:8], slow[:8])
		}
		back := make([]uint8, len(q))
		UnpackLow(back, fast, b)
		if string(back) != string(q) {
			t.Fatalf("b=%d: values did not come back", b)
		}
	}
}

// BenchmarkEncodeLow is the cost of encoding an expert-shaped matrix at
// 3 and 2 bits, which writing a low-bit store pays for every record.
func BenchmarkEncodeLow(b *testing.B) {
	r := rand.New(rand.NewPCG(5, 6))
	w := make([]float32, 1024*4096)
	for i := range w {
		w[i] = float32(r.NormFloat64())
	}
	for _, k := range []format.Kind{format.Q3, format.Q2} {
		b.Run(string(k), func(b *testing.B) {
			b.SetBytes(int64(4 * len(w)))
			for range b.N {
				if _, err := Encode(w, 1024, 4096, k); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
