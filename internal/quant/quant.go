// Package quant converts float32 weights to the storage kinds of the packed
// format (bf16, affine q8 and q4 in groups of format.GroupSize) and back.
//
// Affine quantisation per group: scale = (max-min)/(2^b-1), bias = min,
// both rounded to half precision (the packed format stores them as halves),
// then q = round((w-bias)/scale) against the rounded pair, so w ≈ scale*q +
// bias and the group's extreme values are exact up to that rounding.
package quant

import (
	"fmt"
	"math"

	"github.com/sluicelm/sluice/internal/format"
)

// BF16 rounds a float32 to bfloat16 (round to nearest even), as torch does.
func BF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 { // NaN: keep it a NaN
		return uint16(b>>16) | 0x40
	}
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

// BF16ToF32 widens a bfloat16 (a 16-bit shift).
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// Encoded is a matrix in a storage kind; Scales and Biases are nil unless
// the kind is quantised. Their values are half-precision values widened
// (what the packed format stores, see PutHalves).
type Encoded struct {
	Values []byte
	Scales []float32 // [rows][cols/GroupSize]
	Biases []float32
}

// Encode converts a row-major [rows][cols] float32 matrix to kind k.
func Encode(w []float32, rows, cols int, k format.Kind) (*Encoded, error) {
	if len(w) != rows*cols {
		return nil, fmt.Errorf("quant: %d values for a [%d %d] matrix", len(w), rows, cols)
	}
	if k.Quantised() && cols%format.GroupSize != 0 {
		return nil, fmt.Errorf("quant: %s needs columns divisible by %d, have %d", k, format.GroupSize, cols)
	}
	vb, _ := k.Sizes(rows, cols)
	e := &Encoded{Values: make([]byte, vb)}
	switch k {
	case format.F32:
		for i, v := range w {
			putU32(e.Values[4*i:], math.Float32bits(v))
		}
	case format.BF16:
		for i, v := range w {
			h := BF16(v)
			e.Values[2*i] = byte(h)
			e.Values[2*i+1] = byte(h >> 8)
		}
	case format.Q8, format.Q4, format.Q3, format.Q2:
		G := format.GroupSize
		ng := rows * cols / G
		e.Scales = make([]float32, ng)
		e.Biases = make([]float32, ng)
		levels := float32(int(1)<<k.Bits() - 1)
		q := make([]uint8, G)
		for g := 0; g < ng; g++ {
			grp := w[g*G : (g+1)*G]
			lo, hi := grp[0], grp[0]
			for _, v := range grp {
				lo = min(lo, v)
				hi = max(hi, v)
			}
			scale, bias := RoundF16((hi-lo)/levels), RoundF16(lo)
			if math.IsInf(float64(scale), 0) || math.IsInf(float64(bias), 0) {
				return nil, fmt.Errorf("quant: group %d of a [%d %d] matrix spans [%g, %g], beyond half precision's ±65504", g, rows, cols, lo, hi)
			}
			lo = bias
			e.Scales[g], e.Biases[g] = scale, lo
			for i, v := range grp {
				if scale == 0 {
					q[i] = 0
					continue
				}
				r := float32(math.Round(float64((v - lo) / scale)))
				q[i] = uint8(min(max(r, 0), levels))
			}
			switch k {
			case format.Q3, format.Q2:
				b := k.Bits()
				PackLow(e.Values[g*G*b/8:(g+1)*G*b/8], q, b)
			case format.Q8:
				copy(e.Values[g*G:], q)
			default:
				dst := e.Values[g*G/2 : g*G/2+G/2]
				for j := 0; j < G/2; j++ {
					dst[j] = q[j] | q[j+G/2]<<4
				}
			}
		}
	case format.MXFP4:
		v, err := EncodeMXFP4(w, rows, cols)
		if err != nil {
			return nil, err
		}
		e.Values = v
	default:
		return nil, fmt.Errorf("quant: cannot encode kind %q", k)
	}
	return e, nil
}

// Decode is Encode's inverse (lossy for quantised kinds): it writes the
// float32 values of a [rows][cols] matrix of kind k into dst.
//
// Each value is float32(scale·q) + bias, the product rounded first: the
// conversion keeps the compiler from fusing it into the addition (Go may,
// and does under GOAMD64=v3), so every build dequantises alike.
func Decode(dst []float32, values []byte, scales, biases []float32, rows, cols int, k format.Kind) {
	switch k {
	case format.F32:
		for i := range dst[:rows*cols] {
			dst[i] = math.Float32frombits(getU32(values[4*i:]))
		}
	case format.BF16:
		for i := range dst[:rows*cols] {
			dst[i] = BF16ToF32(uint16(values[2*i]) | uint16(values[2*i+1])<<8)
		}
	case format.Q8:
		for i := range dst[:rows*cols] {
			g := i / format.GroupSize
			dst[i] = float32(scales[g]*float32(values[i])) + biases[g]
		}
	case format.MXFP4:
		DecodeMXFP4(dst, values, rows, cols)
	case format.Q3, format.Q2:
		G, b := format.GroupSize, k.Bits()
		var q [format.GroupSize]uint8
		for g := 0; g < rows*cols/G; g++ {
			UnpackLow(q[:], values[g*G*b/8:(g+1)*G*b/8], b)
			for j, v := range q {
				dst[g*G+j] = float32(scales[g]*float32(v)) + biases[g]
			}
		}
	case format.Q4:
		G := format.GroupSize
		for g := 0; g < rows*cols/G; g++ {
			src := values[g*G/2:]
			for j := 0; j < G/2; j++ {
				dst[g*G+j] = float32(scales[g]*float32(src[j]&15)) + biases[g]
				dst[g*G+j+G/2] = float32(scales[g]*float32(src[j]>>4)) + biases[g]
			}
		}
	}
}

func putU32(b []byte, v uint32) {
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}

func getU32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

// PackLow writes the b-bit values q (b = 2 or 3; each below 2^b) as a
// little-endian bit stream: value i occupies bits [i*b, (i+1)*b) of dst,
// which it overwrites.
func PackLow(dst []byte, q []uint8, b int) {
	// Whole-byte fast paths, as UnpackLow's: a low-bit store packs
	// gigabytes of values once.
	switch {
	case b == 2 && len(q)%4 == 0 && len(dst) == len(q)/4:
		for j := range len(q) / 4 {
			s := q[4*j : 4*j+4]
			dst[j] = s[0]&3 | s[1]&3<<2 | s[2]&3<<4 | s[3]<<6
		}
		return
	case b == 3 && len(q)%8 == 0 && len(dst) == len(q)/8*3:
		for j := range len(q) / 8 {
			s := q[8*j : 8*j+8]
			w := uint32(s[0]&7) | uint32(s[1]&7)<<3 | uint32(s[2]&7)<<6 | uint32(s[3]&7)<<9 |
				uint32(s[4]&7)<<12 | uint32(s[5]&7)<<15 | uint32(s[6]&7)<<18 | uint32(s[7]&7)<<21
			dst[3*j], dst[3*j+1], dst[3*j+2] = byte(w), byte(w>>8), byte(w>>16)
		}
		return
	}
	packLowBits(dst, q, b)
}

// packLowBits is PackLow's general path, for any width.
func packLowBits(dst []byte, q []uint8, b int) {
	clear(dst)
	for i, v := range q {
		bit := i * b
		w := uint16(v) << (bit & 7)
		dst[bit>>3] |= byte(w)
		if hi := byte(w >> 8); hi != 0 {
			dst[bit>>3+1] |= hi
		}
	}
}

// UnpackLow is PackLow's inverse: it fills q from the bit stream src.
func UnpackLow(q []uint8, src []byte, b int) {
	// Whole-byte fast paths: a miss widens megabytes per record, and the
	// general bit loop costs several nanoseconds a value.
	switch {
	case b == 2 && len(q)%4 == 0 && len(src) >= len(q)/4:
		for j, w := range src[:len(q)/4] {
			d := q[4*j : 4*j+4]
			d[0], d[1], d[2], d[3] = w&3, w>>2&3, w>>4&3, w>>6
		}
		return
	case b == 3 && len(q)%8 == 0 && len(src) >= len(q)/8*3:
		for j := 0; j < len(q)/8; j++ {
			w := uint32(src[3*j]) | uint32(src[3*j+1])<<8 | uint32(src[3*j+2])<<16
			d := q[8*j : 8*j+8]
			d[0], d[1], d[2], d[3] = uint8(w&7), uint8(w>>3&7), uint8(w>>6&7), uint8(w>>9&7)
			d[4], d[5], d[6], d[7] = uint8(w>>12&7), uint8(w>>15&7), uint8(w>>18&7), uint8(w>>21&7)
		}
		return
	}
	unpackLowBits(q, src, b)
}

// unpackLowBits is UnpackLow's general path, for any width.
func unpackLowBits(q []uint8, src []byte, b int) {
	mask := uint16(1)<<b - 1
	for i := range q {
		bit := i * b
		w := uint16(src[bit>>3])
		if bit>>3+1 < len(src) {
			w |= uint16(src[bit>>3+1]) << 8
		}
		q[i] = uint8(w >> (bit & 7) & mask)
	}
}
