package quant

import (
	"encoding/binary"
	"math"
)

// F16 rounds f to IEEE 754 half precision (round to nearest, ties to even;
// subnormals kept, beyond ±65504 rounds to infinity; NaN stays NaN). The
// packed format stores quantisation scales and biases this way.
func F16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	b &= 0x7fffffff
	switch {
	case b > 0x7f800000: // NaN: keep it quiet and a NaN
		return sign | 0x7e00
	case b >= 0x477ff000: // 65520 and up round to infinity (65504 is odd)
		return sign | 0x7c00
	case b >= 0x38800000: // a normal half: 2^-14 and up
		m := b - 112<<23 // rebias the exponent from 127 to 15
		return sign | uint16((m+0xfff+(m>>13)&1)>>13)
	}
	// Below 2^-14 the half's step is 2^-24: round to a multiple of it (the
	// product is exact in float64). 1024 is the smallest normal's code.
	return sign | uint16(math.RoundToEven(float64(math.Float32frombits(b))*(1<<24)))
}

// F16ToF32 widens a half-precision value exactly (a NaN stays a NaN, quiet).
func F16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	e, m := uint32(h>>10)&31, uint32(h&0x3ff)
	switch e {
	case 0: // zero or subnormal: m·2^-24
		v := float32(m) * (1.0 / (1 << 24))
		return math.Float32frombits(math.Float32bits(v) | sign)
	case 31: // infinity, or a NaN made quiet as the F16C and NEON conversions make it
		if m != 0 {
			return math.Float32frombits(sign | 0x7fc00000 | m<<13)
		}
		return math.Float32frombits(sign | 0x7f800000)
	}
	return math.Float32frombits(sign | (e+112)<<23 | m<<13)
}

// PutHalves writes v as little-endian halves (F16 of each) into dst.
func PutHalves(dst []byte, v []float32) {
	for i, x := range v {
		binary.LittleEndian.PutUint16(dst[2*i:], F16(x))
	}
}

// Halves reads n little-endian halves from b, widened to float32.
func Halves(b []byte, n int) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = F16ToF32(binary.LittleEndian.Uint16(b[2*i:]))
	}
	return out
}

// F16s is F16 of each of v.
func F16s(v []float32) []uint16 {
	h := make([]uint16, len(v))
	for i, f := range v {
		h[i] = F16(f)
	}
	return h
}

// RoundF16 is f rounded to the nearest half-precision value, as a float32.
func RoundF16(f float32) float32 { return F16ToF32(F16(f)) }
