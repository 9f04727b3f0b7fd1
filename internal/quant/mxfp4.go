package quant

import (
	"fmt"
	"math"

	"github.com/sluicelm/sluice/internal/format"
)

// E2M1 are the values of MXFP4's 4-bit codes (sign bit 3, then two
// exponent bits and one mantissa bit), as the OCP microscaling spec and
// transformers' FP4_VALUES list them; code 8 is −0 (a Go constant −0
// would be +0, hence the negation at run time).
var E2M1 = func() (t [16]float32) {
	for c, v := range [8]float32{0, 0.5, 1, 1.5, 2, 3, 4, 6} {
		t[c], t[c+8] = v, -v
	}
	return
}()

// E8M0 is the float32 value of an MXFP4 block scale byte, 2^(s−127)
// (exact: 2^-127 is a float32 subnormal). Byte 255 is the spec's NaN.
func E8M0(s byte) float32 {
	if s == 255 {
		return float32(math.NaN())
	}
	return float32(math.Ldexp(1, int(s)-127))
}

// MXFP4Value is the value of code c (low 4 bits) in a block of scale s.
// Every such value is exact in float32.
func MXFP4Value(c, s byte) float32 { return E2M1[c&15] * E8M0(s) }

// EncodeMXFP4 converts a row-major [rows][cols] matrix to format.MXFP4
// (codes then scales, see the kind). Each block of 32 gets the smallest
// scale whose range (6·2^(s−127)) holds its largest magnitude, and each
// value the nearest code; values that are already MXFP4 values (a
// checkpoint's, dequantised) come back exactly, signed zeros included, so
// packing an MXFP4 checkpoint this way is lossless.
func EncodeMXFP4(w []float32, rows, cols int) ([]byte, error) {
	B := format.MXBlock
	if cols%B != 0 {
		return nil, fmt.Errorf("quant: mxfp4 needs columns divisible by %d, have %d", B, cols)
	}
	n := rows * cols
	out := make([]byte, n/2+n/B)
	codes, scales := out[:n/2], out[n/2:]
	for g := 0; g < n/B; g++ {
		grp := w[g*B : (g+1)*B]
		var amax float64
		for i, v := range grp {
			f := float64(v)
			if math.IsNaN(f) || math.IsInf(f, 0) {
				return nil, fmt.Errorf("quant: mxfp4: value %v at row %d column %d is not finite", v, g*B/cols, g*B%cols+i)
			}
			amax = math.Max(amax, math.Abs(f))
		}
		e := 0 // the scale's exponent: amax ≤ 6·2^e, e smallest
		if amax > 0 {
			_, e = math.Frexp(amax / 6)
			for amax > math.Ldexp(6, e) {
				e++
			}
			for amax <= math.Ldexp(6, e-1) {
				e--
			}
		}
		if e+127 > 254 {
			return nil, fmt.Errorf("quant: mxfp4: magnitude %g at row %d is beyond the largest scale", amax, g*B/cols)
		}
		e = max(e, -127) // smaller values round (to zero, mostly)
		scales[g] = byte(e + 127)
		for i, v := range grp {
			y := math.Abs(math.Ldexp(float64(v), -e)) // in units of the scale
			best := 0
			for c := 1; c < 8; c++ {
				if math.Abs(float64(E2M1[c])-y) < math.Abs(float64(E2M1[best])-y) {
					best = c
				}
			}
			if math.Signbit(float64(v)) {
				best |= 8
			}
			codes[g*B/2+i/2] |= byte(best) << (4 * (i % 2))
		}
	}
	return out, nil
}

// DecodeMXFP4 writes the float32 values of a [rows][cols] format.MXFP4
// matrix (values as EncodeMXFP4 lays them out) into dst.
func DecodeMXFP4(dst []float32, values []byte, rows, cols int) {
	n := rows * cols
	codes, scales := values[:n/2], values[n/2:n/2+n/format.MXBlock]
	for i := range dst[:n] {
		c := codes[i/2] >> (4 * (i % 2))
		dst[i] = MXFP4Value(c, scales[i/format.MXBlock])
	}
}
