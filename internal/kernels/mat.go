// Package kernels holds the CPU kernels of the forward pass: matrix products
// in every storage kind of the packed format, norms, rotary embedding,
// attention and the gated DeltaNet step.
//
// Layout: matrices are row-major [rows][cols], a row being one output, so a
// product reads each weight row once and dots it with every activation row.
// Activations are row-major [nb][dim], one row per token.
//
// Determinism: every output element is one dot product whose summation
// order depends only on the matrix and the input row, never on the batch
// size, the split across threads or the other rows. A row's result is
// therefore bit-identical alone, in a prefill chunk or in a verify batch.
package kernels

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/quant"
)

// Mat is a read-only view of a matrix in one storage kind; the slices alias
// mapped or pooled memory.
type Mat struct {
	Rows, Cols int
	Kind       format.Kind
	F32        []float32 // Kind F32: [rows*cols]
	BF16       []uint16  // Kind BF16: [rows*cols]
	Q          []byte    // Q8: [rows*cols]; Q4, MXFP4: [rows*cols/2], see format.Q4, format.MXFP4; Q3, Q2: [rows*cols*bits/8]
	E8         []byte    // MXFP4: [rows][cols/32] block scales (E8M0)
	Scales     []uint16  // quantised: [rows][cols/64] halves (format 3), see widen
	Biases     []uint16
	// Tiled (Q4) says that Q holds each whole tile of TileRows rows
	// with its groups one after another, each group's rows interleaved
	// 8 bytes at a time (TileQ4), rather than row after row; the last
	// Rows%TileRows rows stay row-major. The decode kernel then reads a
	// tile as one sequential stream instead of TileRows streams a row
	// apart. Scales and biases keep their layout. For MXFP4 it says that
	// Q and E8 hold tiles of 16 rows, each row in a 32-bit lane
	// (TileMXFP4).
	Tiled bool
}

// MatFrom builds a view of tensor t inside buf (dense.bin, or an expert
// record with t's offsets relative to it). buf must be 4-byte aligned.
func MatFrom(buf []byte, t *format.Tensor) (Mat, error) {
	m := Mat{Rows: t.Rows(), Cols: t.Cols(), Kind: t.Kind}
	vb, sb := t.Kind.Sizes(m.Rows, m.Cols)
	if t.End() > int64(len(buf)) || t.Offset < 0 {
		return m, fmt.Errorf("tensor %s [%d %d] %s ends at byte %d, past the %d bytes of its file (truncated?)", t.Name, m.Rows, m.Cols, t.Kind, t.End(), len(buf))
	}
	if t.Size != vb {
		return m, fmt.Errorf("tensor %s: size %d, want %d for %v %s", t.Name, t.Size, vb, t.Shape, t.Kind)
	}
	n := m.Rows * m.Cols
	switch t.Kind {
	case format.F32:
		m.F32 = f32s(buf[t.Offset:], n)
	case format.BF16:
		m.BF16 = unsafe.Slice((*uint16)(unsafe.Pointer(&buf[t.Offset])), n)
	case format.Q8, format.Q4, format.Q3, format.Q2:
		// Q3 and Q2 are the low-bit expert records of --miss-bits, which
		// MatMul multiplies as they are (lowbit.go).
		if m.Cols%format.GroupSize != 0 {
			return m, fmt.Errorf("tensor %s: %d columns not a multiple of %d", t.Name, m.Cols, format.GroupSize)
		}
		m.Q = buf[t.Offset : t.Offset+vb]
		if t.Tiled {
			if t.Kind != format.Q4 || m.Rows < TileRows {
				return m, fmt.Errorf("tensor %s: a tiled %s matrix of %d rows (only q4 of %d rows or more is stored tiled)", t.Name, t.Kind, m.Rows, TileRows)
			}
			m.Tiled = true
		}
		m.Scales = f16s(buf[t.ScaleOffset:], int(sb/2))
		m.Biases = f16s(buf[t.BiasOffset:], int(sb/2))
	case format.MXFP4:
		if m.Cols%format.GroupSize != 0 {
			// The int8 activations come in groups of GroupSize.
			return m, fmt.Errorf("tensor %s: %d columns not a multiple of %d", t.Name, m.Cols, format.GroupSize)
		}
		m.Q = buf[t.Offset : t.Offset+int64(n/2)]
		m.E8 = buf[t.Offset+int64(n/2) : t.Offset+vb]
	default:
		return m, fmt.Errorf("tensor %s: unknown kind %q", t.Name, t.Kind)
	}
	return m, nil
}

func f32s(b []byte, n int) []float32 {
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), n)
}

// Row writes row r of m, dequantised, into dst (an embedding lookup).
func (m *Mat) Row(dst []float32, r int) {
	dst = dst[:m.Cols]
	switch m.Kind {
	case format.F32:
		copy(dst, m.F32[r*m.Cols:])
	case format.BF16:
		src := m.BF16[r*m.Cols : (r+1)*m.Cols]
		for i, h := range src {
			dst[i] = math.Float32frombits(uint32(h) << 16)
		}
	case format.Q8:
		G := format.GroupSize
		src := m.Q[r*m.Cols : (r+1)*m.Cols]
		for g := 0; g < m.Cols/G; g++ {
			s, b := quant.F16ToF32(m.Scales[r*m.Cols/G+g]), quant.F16ToF32(m.Biases[r*m.Cols/G+g])
			for j := 0; j < G; j++ {
				dst[g*G+j] = float32(s*float32(src[g*G+j])) + b // as quant.Decode: never fused
			}
		}
	case format.Q4:
		G := format.GroupSize
		var qb [rowQRoom]byte
		src := m.rowQ4(r, qb[:])
		for g := 0; g < m.Cols/G; g++ {
			s, b := quant.F16ToF32(m.Scales[r*m.Cols/G+g]), quant.F16ToF32(m.Biases[r*m.Cols/G+g])
			q := src[g*G/2 : g*G/2+G/2]
			for j, v := range q {
				dst[g*G+j] = float32(s*float32(v&15)) + b
				dst[g*G+j+G/2] = float32(s*float32(v>>4)) + b
			}
		}
	case format.MXFP4:
		B := format.MXBlock
		q, e8 := m.rowMX(r, nil, nil)
		for i := range dst {
			dst[i] = float32(mxCode[q[i/2]>>(4*(i%2))&15]) * mxScale[e8[i/B]]
		}
	}
}

// View is rows lo..hi of m as a matrix of their own (a head's block of
// DeepSeek's W_k^T or W_v), sharing m's memory; ok is false where m is
// tiled and lo or hi is not on a tile's boundary, or the rows are out of
// range.
func (m *Mat) View(lo, hi int) (v Mat, ok bool) {
	if lo < 0 || hi > m.Rows || lo > hi || (m.Tiled && (lo%TileRows != 0 || hi%TileRows != 0)) {
		return Mat{}, false
	}
	C := m.Cols
	v = Mat{Rows: hi - lo, Cols: C, Kind: m.Kind, Tiled: m.Tiled}
	switch m.Kind {
	case format.F32:
		v.F32 = m.F32[lo*C : hi*C]
	case format.BF16:
		v.BF16 = m.BF16[lo*C : hi*C]
	case format.Q8, format.Q4:
		// A tile holds TileRows whole rows' bytes, so whole tiles are
		// the same byte range as the rows they hold.
		b := m.Kind.Bits()
		v.Q = m.Q[lo*C*b/8 : hi*C*b/8]
		ng := C / format.GroupSize
		v.Scales, v.Biases = m.Scales[lo*ng:hi*ng], m.Biases[lo*ng:hi*ng]
	default:
		return Mat{}, false
	}
	return v, true
}

// DotRows writes out[j] = W[lo+j]·x for j < len(out) on the calling
// goroutine: a product of a few rows with one activation row, as
// DeepSeek's absorb and W_v take per (row, head) on every thread. Each
// element is dotRow's, as a matrix product's is. xsum is scratch of at
// least Cols/GroupSize floats for quantised kinds.
func (m *Mat) DotRows(out []float32, lo int, x, xsum []float32) {
	if m.Kind.Quantised() {
		xsum = xsum[:m.Cols/format.GroupSize]
		GroupSums(xsum, x[:m.Cols])
	}
	for j := range out {
		out[j] = m.dotRow(lo+j, x, xsum)
	}
}

// GroupSums writes the sum of each group of format.GroupSize values of x
// into dst; quantised dot products use it for the bias term, since
// Σ(s·q+b)·x = s·Σq·x + b·Σx.
func GroupSums(dst, x []float32) {
	G := format.GroupSize
	for g := range dst[:len(x)/G] {
		xs := x[g*G : g*G+G]
		var s0, s1, s2, s3 float32
		for j := 0; j < G; j += 4 {
			s0 += xs[j]
			s1 += xs[j+1]
			s2 += xs[j+2]
			s3 += xs[j+3]
		}
		dst[g] = (s0 + s1) + (s2 + s3)
	}
}

// rowRoom is the stack room of one row's widened scales and biases in
// dotRow: 256 groups (16384 columns); wider rows take a heap buffer.
const rowRoom = 512

// dotRow is out = W[r]·x for one weight row and one activation row; xsum
// holds x's group sums for quantised kinds. Every matrix product goes
// through it, which is what makes results batch-invariant.
func (m *Mat) dotRow(r int, x, xsum []float32) float32 {
	C := m.Cols
	if useAVX2 && C%16 == 0 {
		x = x[:C]
		switch m.Kind {
		case format.F32:
			return dotF32AVX2(&m.F32[r*C], &x[0], C)
		case format.BF16:
			return dotBF16AVX2(&m.BF16[r*C], &x[0], C)
		case format.Q8:
			ng := C / format.GroupSize
			_ = m.Q[(r+1)*C-1]
			_ = xsum[ng-1]
			var a [rowRoom]float32
			room := a[:]
			s, b := m.widen(&room, r, r+1)
			return dotQ8AVX2(&m.Q[r*C], &s[0], &b[0], &x[0], &xsum[0], ng)
		case format.Q4:
			ng := C / format.GroupSize
			var qb [rowQRoom]byte
			q := m.rowQ4(r, qb[:])
			_ = q[C/2-1]
			_ = xsum[ng-1]
			var a [rowRoom]float32
			room := a[:]
			s, b := m.widen(&room, r, r+1)
			return dotQ4AVX2(&q[0], &s[0], &b[0], &x[0], &xsum[0], ng)
		}
	}
	return m.dotRowGo(r, x, xsum)
}

// dotRowGo is the pure-Go twin of dotRow's assembly kernels.
func (m *Mat) dotRowGo(r int, x, xsum []float32) float32 {
	C := m.Cols
	switch m.Kind {
	case format.F32:
		return dotF32(m.F32[r*C:(r+1)*C], x)
	case format.BF16:
		return dotBF16(m.BF16[r*C:(r+1)*C], x)
	case format.Q8:
		var a [rowRoom]float32
		room := a[:]
		s, b := m.widen(&room, r, r+1)
		return dotQ8(m.Q[r*C:(r+1)*C], s, b, x, xsum)
	case format.Q4:
		var a [rowRoom]float32
		room := a[:]
		s, b := m.widen(&room, r, r+1)
		var qb [rowQRoom]byte
		return dotQ4(m.rowQ4(r, qb[:]), s, b, x, xsum)
	}
	panic("kernels: unknown matrix kind " + string(m.Kind))
}

// dotF32 is the canonical f32 dot product (see canon.go): element i is
// fused into lane i%16 in index order, the lanes reduced by sum16.
func dotF32(w, x []float32) float32 {
	x = x[:len(w)]
	var a [16]float32
	i := 0
	for ; i+16 <= len(w); i += 16 {
		ws, xs := (*[16]float32)(w[i:]), (*[16]float32)(x[i:])
		for l := range a {
			// fma32, written out so the loop stays call-free.
			p := float64(ws[l]) * float64(xs[l])
			z := float64(a[l])
			s := p + z
			if math.Float64bits(s)<<36 == 0 {
				s = roundOdd(p, z, s)
			}
			a[l] = float32(s)
		}
	}
	for l, v := range w[i:] {
		a[l] = fma32(v, x[i+l], a[l])
	}
	return sum16(&a)
}

// dotBF16 is dotF32 with bf16 weights (widened exactly to float32).
func dotBF16(w []uint16, x []float32) float32 {
	x = x[:len(w)]
	var a [16]float32
	i := 0
	for ; i+16 <= len(w); i += 16 {
		ws, xs := (*[16]uint16)(w[i:]), (*[16]float32)(x[i:])
		for l := range a {
			// fma32, written out so the loop stays call-free.
			p := float64(math.Float32frombits(uint32(ws[l])<<16)) * float64(xs[l])
			z := float64(a[l])
			s := p + z
			if math.Float64bits(s)<<36 == 0 {
				s = roundOdd(p, z, s)
			}
			a[l] = float32(s)
		}
	}
	for l, h := range w[i:] {
		a[l] = fma32(math.Float32frombits(uint32(h)<<16), x[i+l], a[l])
	}
	return sum16(&a)
}

// dotQ8 is the canonical q8 dot product, dotQ8AVX2's order: per group the
// 64 products q·x are fused into lanes j%16, lane l+8 is added to lane l,
// and each of the 8 lanes accumulates scale·lane fused across groups; the
// bias terms bias·xsum (rounded products) are one running sum, added
// after hsum8 of the lanes.
func dotQ8(q []byte, scales, biases, x, xsum []float32) float32 {
	const G = format.GroupSize
	var acc [8]float32
	var bsum float32
	biases = biases[:len(scales)]
	xsum = xsum[:len(scales)]
	for g := range scales {
		qs := (*[G]byte)(q[g*G:])
		xs := (*[G]float32)(x[g*G:])
		var a [16]float32
		for j, v := range qs {
			a[j&15] = fma32(float32(v), xs[j], a[j&15])
		}
		for l := range acc {
			acc[l] = fma32(scales[g], a[l]+a[l+8], acc[l])
		}
		bsum += float32(biases[g] * xsum[g])
	}
	return hsum8(&acc) + bsum
}

// dotQ4 is the canonical q4 dot product with float activations,
// dotQ4AVX2's order. Element e of a group (its nibble in byte e%32, low for
// e < 32) is fused into lane e%8 of one of four accumulators by its 8-element
// block: blocks 0 and 2 into the first, 1 and 3 the second, 4 and 6 the
// third, 5 and 7 the fourth; the group's 8 lanes are (first+second) +
// (third+fourth); then scale and bias as in dotQ8.
func dotQ4(q []byte, scales, biases, x, xsum []float32) float32 {
	const G = format.GroupSize
	var acc [8]float32
	var bsum float32
	biases = biases[:len(scales)]
	xsum = xsum[:len(scales)]
	for g := range scales {
		// Fixed-size array views let the compiler drop every bounds check
		// in the inner loop.
		qs := (*[G / 2]byte)(q[g*G/2:])
		xs := (*[G]float32)(x[g*G:])
		var a [4][8]float32
		for e := 0; e < G; e++ {
			v := qs[e&31] & 15
			if e >= G/2 {
				v = qs[e&31] >> 4
			}
			k := (e>>3)&1 | (e>>5)<<1
			a[k][e&7] = fma32(float32(v), xs[e], a[k][e&7])
		}
		for l := range acc {
			t := (a[0][l] + a[1][l]) + (a[2][l] + a[3][l])
			acc[l] = fma32(scales[g], t, acc[l])
		}
		bsum += float32(biases[g] * xsum[g])
	}
	return hsum8(&acc) + bsum
}
