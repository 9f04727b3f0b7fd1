package gguf

import (
	"encoding/binary"
	"math"

	"github.com/sluicelm/sluice/internal/quant"
)

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
		binary.LittleEndian.PutUint16(out, quant.F16(d))
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
		d := quant.F16ToF32(binary.LittleEndian.Uint16(in))
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
		binary.LittleEndian.PutUint16(out, quant.F16(d))
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
		d := quant.F16ToF32(binary.LittleEndian.Uint16(in))
		for j := 0; j < BlockSize; j++ {
			dst[b*BlockSize+j] = float32(int8(in[2+j])) * d
		}
	}
}

// PutMXFP4 writes one block of 32 values as MXFP4 into dst (17 bytes):
// the E8M0 scale byte e, then byte j holding code j in its low nibble and
// code j+16 in its high one. codes are E2M1 codes in the order of the
// values; the block's values are E2M1(code)·2^(e−127), the same bytes
// meaning the same values as in sluice's MXFP4 records.
func PutMXFP4(dst []byte, codes *[BlockSize]byte, e byte) {
	dst[0] = e
	for j := 0; j < BlockSize/2; j++ {
		dst[1+j] = codes[j]&15 | codes[j+BlockSize/2]<<4
	}
}

// DequantizeMXFP4 decodes MXFP4 blocks (PutMXFP4's layout) into dst.
func DequantizeMXFP4(dst []float32, src []byte) {
	const bs = 1 + BlockSize/2
	for b := 0; b < len(dst)/BlockSize; b++ {
		in := src[b*bs : (b+1)*bs]
		x := dst[b*BlockSize : (b+1)*BlockSize]
		for j := 0; j < BlockSize/2; j++ {
			x[j] = quant.MXFP4Value(in[1+j]&15, in[0])
			x[j+BlockSize/2] = quant.MXFP4Value(in[1+j]>>4, in[0])
		}
	}
}
