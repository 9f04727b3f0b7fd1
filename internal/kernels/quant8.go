package kernels

import (
	"math"

	"github.com/sluicelm/sluice/internal/format"
)

// QuantizeRow8 quantises x to int8 per group of format.GroupSize,
// symmetric: x ≈ xs[g]·x8[i], xs[g] = max|x|/127. It feeds the integer design
// of the q4 dot product (dotQ4I8).
func QuantizeRow8(x8 []int8, xs []float32, x []float32) {
	if ng := len(x) / format.GroupSize; useAVX2 && ng > 0 {
		_, _ = x8[ng*format.GroupSize-1], xs[ng-1]
		quantizeRow8AVX2(&x8[0], &xs[0], &x[0], ng)
		return
	}
	quantizeRow8Go(x8, xs, x)
}

// quantizeRow8Go is QuantizeRow8's pure-Go twin (identical results).
func quantizeRow8Go(x8 []int8, xs []float32, x []float32) {
	const G = format.GroupSize
	// Adding and subtracting 1.5·2^23 rounds a float32 of magnitude below
	// 2^22 to the nearest integer (ties to even) in two float operations,
	// far cheaper than math.Round through float64.
	const magic = 12582912
	for g := range xs[:len(x)/G] {
		grp := (*[G]float32)(x[g*G:])
		var m float32
		for _, v := range grp {
			m = max(m, math.Float32frombits(math.Float32bits(v)&0x7fffffff))
		}
		s := m / 127
		xs[g] = s
		var inv float32
		if s > 0 {
			inv = 1 / s
		}
		dst := (*[G]int8)(x8[g*G:])
		for i, v := range grp {
			r := float32(v*inv) + magic // rounded product, as VMULPS; never fused
			dst[i] = int8(int32(r - magic))
		}
	}
}

// dotQ4I8 is the q4 dot product of one weight row and one activation row
// in the integer design, and the arithmetic every q4 kernel reproduces bit
// for bit. Per group g, in order:
//
//	s   = Σ q·x8                   exact, in int32
//	acc = acc + (float32(s)·(scale·xs) + bias·xsum)
//
// each product and sum rounded to float32 on its own, no fused
// multiply-add, starting from acc = 0. The integer sum makes the order of
// the 64 products irrelevant, so a kernel may split a group across lanes
// however suits its layout; the float part is one short chain per output,
// which the tile kernels run for 8 or 16 outputs per vector. The explicit
// float32 conversions keep the compiler from fusing a product into the
// following addition (the spec allows that, and GOAMD64=v3 does it).
func dotQ4I8(q []byte, scales, biases []float32, x8 []int8, xs, xsum []float32) float32 {
	const G = format.GroupSize
	var acc float32
	for g := range scales {
		qs := (*[G / 2]byte)(q[g*G/2:])
		xg := (*[G]int8)(x8[g*G:])
		var s int32
		for j, b := range qs {
			s += int32(b&15)*int32(xg[j]) + int32(b>>4)*int32(xg[G/2+j])
		}
		c := float32(scales[g] * xs[g])
		t := float32(float32(s) * c)
		b := float32(biases[g] * xsum[g])
		acc += t + b
	}
	return acc
}
