package gguf

import (
	"encoding/binary"
	"math"
)

// Half returns the IEEE half-precision bits nearest to f (ties to even),
// as ggml's scalar conversion gives them.
func Half(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23&0xff) - 127 + 15
	man := b & 0x7fffff
	switch {
	case b&0x7fffffff > 0x7f800000: // NaN
		return sign | 0x7e00
	case exp >= 0x1f: // overflow (or infinity)
		return sign | 0x7c00
	case exp <= 0:
		if exp < -10 {
			return sign
		}
		// Subnormal: shift the implicit bit in, round to nearest even.
		man |= 0x800000
		shift := uint32(14 - exp)
		h := man >> shift
		rem := man & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rem > half || rem == half && h&1 == 1 {
			h++
		}
		return sign | uint16(h)
	}
	h := uint32(exp)<<10 | man>>13
	rem := man & 0x1fff
	if rem > 0x1000 || rem == 0x1000 && h&1 == 1 {
		h++ // may carry into the exponent, which is still right
	}
	return sign | uint16(h)
}

// FromHalf is the float32 value of half-precision bits h.
func FromHalf(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	man := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case exp == 0:
		if man == 0 {
			return math.Float32frombits(sign)
		}
		// Subnormal: value = man · 2^-24.
		v := float32(man) * (1.0 / (1 << 24))
		if sign != 0 {
			v = -v
		}
		return v
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | man<<13)
}

// QuantizeQ4_0 writes src (a multiple of BlockSize values) as Q4_0 blocks
// into dst, as ggml's reference quantize_row_q4_0: per block the value of
// largest magnitude m gives d = m/-8, and each value q = min(15,
// trunc(v/d + 8.5)).
func QuantizeQ4_0(dst []byte, src []float32) {
	const bs = 2 + BlockSize/2
	for b := 0; b < len(src)/BlockSize; b++ {
		x := src[b*BlockSize : (b+1)*BlockSize]
		var amax, m float32
		for _, v := range x {
			if a := float32(math.Abs(float64(v))); a > amax {
				amax, m = a, v
			}
		}
		d := m / -8
		var id float32
		if d != 0 {
			id = 1 / d
		}
		out := dst[b*bs : (b+1)*bs]
		binary.LittleEndian.PutUint16(out, Half(d))
		for j := 0; j < BlockSize/2; j++ {
			// The products are rounded before the add (no fused
			// multiply-add on arm64), so every CPU writes the same file.
			q0 := min(15, int(float32(x[j]*id)+8.5))
			q1 := min(15, int(float32(x[j+BlockSize/2]*id)+8.5))
			out[2+j] = byte(q0) | byte(q1)<<4
		}
	}
}

// DequantizeQ4_0 is the inverse of QuantizeQ4_0: dst[i] = (q-8)·d.
func DequantizeQ4_0(dst []float32, src []byte) {
	const bs = 2 + BlockSize/2
	for b := 0; b < len(dst)/BlockSize; b++ {
		in := src[b*bs : (b+1)*bs]
		d := FromHalf(binary.LittleEndian.Uint16(in))
		x := dst[b*BlockSize : (b+1)*BlockSize]
		for j := 0; j < BlockSize/2; j++ {
			x[j] = float32(int(in[2+j]&15)-8) * d
			x[j+BlockSize/2] = float32(int(in[2+j]>>4)-8) * d
		}
	}
}

// QuantizeQ8_0 writes src as Q8_0 blocks, as ggml's reference
// quantize_row_q8_0: d = max|v|/127, q = round(v/d).
func QuantizeQ8_0(dst []byte, src []float32) {
	const bs = 2 + BlockSize
	for b := 0; b < len(src)/BlockSize; b++ {
		x := src[b*BlockSize : (b+1)*BlockSize]
		var amax float32
		for _, v := range x {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		d := amax / 127
		var id float32
		if d != 0 {
			id = 1 / d
		}
		out := dst[b*bs : (b+1)*bs]
		binary.LittleEndian.PutUint16(out, Half(d))
		for j, v := range x {
			out[2+j] = byte(int8(math.Round(float64(v * id))))
		}
	}
}

// DequantizeQ8_0 is the inverse of QuantizeQ8_0: dst[i] = q·d.
func DequantizeQ8_0(dst []float32, src []byte) {
	const bs = 2 + BlockSize
	for b := 0; b < len(dst)/BlockSize; b++ {
		in := src[b*bs : (b+1)*bs]
		d := FromHalf(binary.LittleEndian.Uint16(in))
		for j := 0; j < BlockSize; j++ {
			dst[b*BlockSize+j] = float32(int8(in[2+j])) * d
		}
	}
}
