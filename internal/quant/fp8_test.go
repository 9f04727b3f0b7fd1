package quant

import (
	"math"
	"testing"
)

// TestE4M3 checks the decoder against the format's definition on its
// landmarks, and that rounding is the identity on every finite code and
// picks a nearest code in between.
func TestE4M3(t *testing.T) {
	for b, want := range map[byte]float32{0x00: 0, 0x01: 1.0 / 512, 0x07: 7.0 / 512, 0x08: 1.0 / 64, 0x38: 1, 0x3c: 1.5, 0x7e: 448, 0xb8: -1, 0xfe: -448} {
		if got := E4M3(b); got != want {
			t.Errorf("E4M3(%#x) = %v, want %v", b, got, want)
		}
	}
	if !math.IsNaN(float64(E4M3(0x7f))) || !math.IsNaN(float64(E4M3(0xff))) {
		t.Error("0x7f/0xff are not NaN")
	}
	for b := 0; b < 256; b++ {
		if b&0x7f == 0x7f {
			continue
		}
		v := E4M3(byte(b))
		if got := ToE4M3(v); E4M3(got) != v || (v == 0 && got != byte(b)) {
			t.Errorf("ToE4M3(E4M3(%#x) = %v) = %#x", b, v, got)
		}
		// Halfway to the next code up rounds to the even one of the two.
		if b < 0x7e {
			mid := (float64(v) + float64(E4M3(byte(b+1)))) / 2
			want := byte(b)
			if b&1 == 1 {
				want = byte(b + 1)
			}
			if got := ToE4M3(float32(mid)); got != want {
				t.Errorf("ToE4M3(%v) = %#x, want %#x", mid, got, want)
			}
		}
	}
	if ToE4M3(1e6) != 0x7e || ToE4M3(-500) != 0xfe {
		t.Error("no saturation at ±448")
	}
}
