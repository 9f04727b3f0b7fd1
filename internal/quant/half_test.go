package quant

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestF16 checks the half-precision conversions: every half widens and
// rounds back to itself, and rounding any float picks the nearest half
// (ties to the even code), with the format's landmarks exact.
func TestF16(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		v := F16ToF32(uint16(h))
		if h&0x7c00 == 0x7c00 && h&0x3ff != 0 {
			if !math.IsNaN(float64(v)) || !math.IsNaN(float64(F16ToF32(F16(v)))) {
				t.Fatalf("half %#04x: NaN lost (%v)", h, v)
			}
			continue
		}
		if got := F16(v); got != uint16(h) {
			t.Fatalf("F16(F16ToF32(%#04x) = %v) = %#04x", h, v, got)
		}
	}
	for f, want := range map[float32]uint16{1: 0x3c00, -2: 0xc000, 65504: 0x7bff, 65519: 0x7bff, 65520: 0x7c00, 1e6: 0x7c00,
		0x1p-14: 0x0400, 0.1: 0x2e66, 0: 0, 1.0009765625: 0x3c01, 0x1p-24: 0x0001, 0x1p-25: 0, 0x1.8p-25: 0x0001, 0x3p-25: 0x0002, 0x5p-25: 0x0002, 1 + 0x1p-11: 0x3c00, 1 + 0x3p-11: 0x3c02} {
		if got := F16(f); got != want {
			t.Errorf("F16(%v) = %#04x, want %#04x", f, got, want)
		}
	}
	// Nearest: no half lies strictly closer than the chosen one.
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 200000; i++ {
		f := math.Float32frombits(r.Uint32())
		if math.IsNaN(float64(f)) || math.Abs(float64(f)) >= 65520 {
			continue
		}
		h := F16(f)
		got := float64(F16ToF32(h))
		d := math.Abs(got - float64(f))
		for _, n := range []uint16{h - 1, h + 1} {
			if n&0x7c00 == 0x7c00 || (n^h)&0x8000 != 0 {
				continue
			}
			if dn := math.Abs(float64(F16ToF32(n)) - float64(f)); dn < d || (dn == d && h&1 == 1) {
				t.Fatalf("F16(%g) = %#04x (%g), but %#04x (%g) is nearer or the even tie", f, h, got, n, F16ToF32(n))
			}
		}
	}
}

// halfRef decodes binary16 from its definition, independently of F16ToF32.
func halfRef(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp := int(h>>10) & 0x1f
	man := float64(h & 0x3ff)
	switch exp {
	case 0:
		return sign * math.Ldexp(man, -24)
	case 0x1f:
		if man == 0 {
			return math.Inf(int(sign))
		}
		return math.NaN()
	}
	return sign * math.Ldexp(1+man/1024, exp-15)
}

func TestF16ToF32KnownValues(t *testing.T) {
	cases := []struct {
		h    uint16
		want float32
	}{
		{0x3c00, 1},
		{0xbc00, -1},
		{0x4000, 2},
		{0xc100, -2.5},
		{0x3555, 0.333251953125},
		{0x7bff, 65504},                       // largest finite
		{0x0400, float32(math.Ldexp(1, -14))}, // smallest normal
		{0x03ff, float32(math.Ldexp(1023, -24))},
		{0x0200, float32(math.Ldexp(1, -15))},
		{0x0001, float32(math.Ldexp(1, -24))}, // smallest subnormal
		{0x8001, -float32(math.Ldexp(1, -24))},
		{0x7c00, float32(math.Inf(1))},
		{0xfc00, float32(math.Inf(-1))},
	}
	for _, c := range cases {
		if got := F16ToF32(c.h); got != c.want {
			t.Errorf("F16ToF32(%#04x) = %g, want %g", c.h, got, c.want)
		}
	}
	if z := F16ToF32(0x0000); z != 0 || math.Signbit(float64(z)) {
		t.Errorf("F16ToF32(0x0000) = %g (signbit %v), want +0", z, math.Signbit(float64(z)))
	}
	if z := F16ToF32(0x8000); z != 0 || !math.Signbit(float64(z)) {
		t.Errorf("F16ToF32(0x8000) = %g (signbit %v), want -0", z, math.Signbit(float64(z)))
	}
	for _, h := range []uint16{0x7e00, 0x7c01, 0xfe00} {
		if v := F16ToF32(h); !math.IsNaN(float64(v)) {
			t.Errorf("F16ToF32(%#04x) = %g, want NaN", h, v)
		}
	}
}

func TestF16ToF32Exhaustive(t *testing.T) {
	for i := 0; i < 1<<16; i++ {
		h := uint16(i)
		got, want := float64(F16ToF32(h)), halfRef(h)
		if math.IsNaN(want) {
			if !math.IsNaN(got) {
				t.Fatalf("F16ToF32(%#04x) = %g, want NaN", h, got)
			}
			continue
		}
		if got != want || math.Signbit(got) != math.Signbit(want) {
			t.Fatalf("F16ToF32(%#04x) = %g, want %g", h, got, want)
		}
	}
}
