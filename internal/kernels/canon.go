package kernels

import "math"

// The canonical arithmetic of the float kernels. Every float dot product,
// axpy, attention score and value mix, and delta-rule step is defined by
// its pure-Go twin, and every assembly version (AVX2 on amd64, NEON on
// arm64) computes exactly the twin's operations in the twin's order, so
// results are the same bits on every CPU and with SLUICE_NOSIMD:
//
//   - a multiply-add inside a dot product, axpy, value mix or delta-rule
//     update is fused (one rounding: VFMADD231PS, FMLA), computed in Go by
//     fma32;
//   - a dot product of n elements accumulates element i into lane i%16 in
//     index order, then adds lane l+8 to lane l and reduces the 8 lanes
//     with hsum8 (sum16);
//   - everything else (scales, biases, the int8 q4 chain, the element-wise
//     ops) rounds each product before it is added, and the Go twins say so
//     with explicit float32 conversions: Go fuses float32 x*y+z on arm64
//     (and on amd64 with GOAMD64=v3) unless a conversion forbids it.

// fma32 is a·b+c rounded once to float32, as the FMA instructions compute
// it, in portable Go. The product of two float32 is exact in float64; the
// sum is rounded to float64 with its error recovered exactly (TwoSum) and
// turned into round-to-odd, after which the rounding to float32 is correct:
// 53 bits hold 24 + 2, so the two roundings cannot compound as plain
// float32(a*b+c in float64) can.
func fma32(a, b, c float32) float32 {
	p := float64(a) * float64(b)
	s := p + float64(c)
	if math.Float64bits(s)<<36 == 0 {
		s = roundOdd(p, float64(c), s)
	}
	// Otherwise s is not half-way between two float32 (those have at
	// least 28 trailing zero bits), so it rounds to float32 as the exact
	// sum does: a float32 tie is a float64, and s is the float64 nearest
	// to the exact sum, so no tie lies between them.
	return float32(s)
}

// roundOdd is s = p+z rounded to float64 made round-to-odd: unchanged if
// exact, else the neighbour of the exact sum with an odd last bit.
//
//go:noinline
func roundOdd(p, z, s float64) float64 {
	bb := s - p
	e := (p - (s - bb)) + (z - bb)
	if e > 0 || e < 0 { // inexact (false for the NaN of infinite operands)
		bits := math.Float64bits(s)
		if (e < 0) != (s < 0) {
			bits-- // s is past the exact sum: step back toward zero
		}
		s = math.Float64frombits(bits | 1)
	}
	return s
}

// sum16 reduces 16 lanes: lane l+8 into lane l, then hsum8, the order of
// the assembly's final VADDPS and horizontal sum.
func sum16(a *[16]float32) float32 {
	var s [8]float32
	for l := range s {
		s[l] = a[l] + a[l+8]
	}
	return hsum8(&s)
}
