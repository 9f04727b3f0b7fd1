package quant

import "math"

// E4M3 is the value of a float8_e4m3fn byte (sign, 4 exponent bits with
// bias 7, 3 mantissa bits; no infinities, 0x7f and 0xff are NaN), exact in
// float32.
func E4M3(b byte) float32 {
	e, m := int(b>>3&15), float64(b&7)
	var v float64
	switch {
	case e == 15 && m == 7:
		return float32(math.NaN())
	case e == 0:
		v = math.Ldexp(m, -9) // subnormal: m/8 · 2^-6
	default:
		v = math.Ldexp(8+m, e-10)
	}
	if b&0x80 != 0 {
		v = -v
	}
	return float32(v)
}

// ToE4M3 rounds f to the nearest float8_e4m3fn value (ties to even),
// saturating at ±448, the largest; NaN stays NaN. It is how a block-scaled
// FP8 checkpoint is made (torch's .to(torch.float8_e4m3fn) of values
// scaled into range).
func ToE4M3(f float32) byte {
	x := float64(f)
	if math.IsNaN(x) {
		return 0x7f
	}
	var sign byte
	if math.Signbit(x) {
		sign, x = 0x80, -x
	}
	if x >= 448 {
		return sign | 0x7e
	}
	if x < math.Ldexp(1, -6) { // subnormal range, steps of 2^-9
		q := math.RoundToEven(math.Ldexp(x, 9)) // ≤ 8: 8 is the smallest normal's code
		return sign | byte(q)
	}
	_, e := math.Frexp(x) // x = frac·2^e, frac in [0.5, 1)
	e--                   // x in [2^e, 2^(e+1))
	q := math.RoundToEven(math.Ldexp(x, 3-e))
	if q == 16 {
		q, e = 8, e+1
	}
	if e+7 > 15 || (e+7 == 15 && q > 14) {
		return sign | 0x7e
	}
	return sign | byte(e+7)<<3 | byte(q-8)
}
