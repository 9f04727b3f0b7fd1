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
)

// Mat is a read-only view of a matrix in one storage kind; the slices alias
// mapped or pooled memory.
type Mat struct {
	Rows, Cols int
	Kind       format.Kind
	F32        []float32 // Kind F32: [rows*cols]
	BF16       []uint16  // Kind BF16: [rows*cols]
	Q          []byte    // Q8: [rows*cols]; Q4, MXFP4: [rows*cols/2], see format.Q4, format.MXFP4
	E8         []byte    // MXFP4: [rows][cols/32] block scales (E8M0)
	Scales     []float32 // quantised: [rows][cols/64]
	Biases     []float32
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
	case format.Q8, format.Q4:
		if m.Cols%format.GroupSize != 0 {
			return m, fmt.Errorf("tensor %s: %d columns not a multiple of %d", t.Name, m.Cols, format.GroupSize)
		}
		m.Q = buf[t.Offset : t.Offset+vb]
		m.Scales = f32s(buf[t.ScaleOffset:], int(sb/4))
		m.Biases = f32s(buf[t.BiasOffset:], int(sb/4))
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
			s, b := m.Scales[r*m.Cols/G+g], m.Biases[r*m.Cols/G+g]
			for j := 0; j < G; j++ {
				dst[g*G+j] = float32(s*float32(src[g*G+j])) + b // as quant.Decode: never fused
			}
		}
	case format.Q4:
		G := format.GroupSize
		src := m.Q[r*m.Cols/2 : (r+1)*m.Cols/2]
		for g := 0; g < m.Cols/G; g++ {
			s, b := m.Scales[r*m.Cols/G+g], m.Biases[r*m.Cols/G+g]
			q := src[g*G/2 : g*G/2+G/2]
			for j, v := range q {
				dst[g*G+j] = float32(s*float32(v&15)) + b
				dst[g*G+j+G/2] = float32(s*float32(v>>4)) + b
			}
		}
	case format.MXFP4:
		B := format.MXBlock
		q, e8 := m.Q[r*m.Cols/2:(r+1)*m.Cols/2], m.E8[r*m.Cols/B:(r+1)*m.Cols/B]
		for i := range dst {
			dst[i] = float32(mxCode[q[i/2]>>(4*(i%2))&15]) * mxScale[e8[i/B]]
		}
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
			return dotQ8AVX2(&m.Q[r*C], &m.Scales[r*ng], &m.Biases[r*ng], &x[0], &xsum[0], ng)
		case format.Q4:
			ng := C / format.GroupSize
			_ = m.Q[(r+1)*C/2-1]
			_ = xsum[ng-1]
			return dotQ4AVX2(&m.Q[r*C/2], &m.Scales[r*ng], &m.Biases[r*ng], &x[0], &xsum[0], ng)
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
		ng := C / format.GroupSize
		return dotQ8(m.Q[r*C:(r+1)*C], m.Scales[r*ng:(r+1)*ng], m.Biases[r*ng:(r+1)*ng], x, xsum)
	case format.Q4:
		ng := C / format.GroupSize
		return dotQ4(m.Q[r*C/2:(r+1)*C/2], m.Scales[r*ng:(r+1)*ng], m.Biases[r*ng:(r+1)*ng], x, xsum)
	}
	panic("kernels: unknown matrix kind " + string(m.Kind))
}

func dotF32(w, x []float32) float32 {
	x = x[:len(w)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(w); i += 4 {
		s0 += w[i] * x[i]
		s1 += w[i+1] * x[i+1]
		s2 += w[i+2] * x[i+2]
		s3 += w[i+3] * x[i+3]
	}
	for ; i < len(w); i++ {
		s0 += w[i] * x[i]
	}
	return (s0 + s1) + (s2 + s3)
}

func dotBF16(w []uint16, x []float32) float32 {
	x = x[:len(w)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(w); i += 4 {
		s0 += math.Float32frombits(uint32(w[i])<<16) * x[i]
		s1 += math.Float32frombits(uint32(w[i+1])<<16) * x[i+1]
		s2 += math.Float32frombits(uint32(w[i+2])<<16) * x[i+2]
		s3 += math.Float32frombits(uint32(w[i+3])<<16) * x[i+3]
	}
	for ; i < len(w); i++ {
		s0 += math.Float32frombits(uint32(w[i])<<16) * x[i]
	}
	return (s0 + s1) + (s2 + s3)
}

func dotQ8(q []byte, scales, biases, x, xsum []float32) float32 {
	const G = format.GroupSize
	var acc float32
	biases = biases[:len(scales)]
	xsum = xsum[:len(scales)]
	for g := range scales {
		qs := (*[G]byte)(q[g*G:])
		xs := (*[G]float32)(x[g*G:])
		var s0, s1, s2, s3 float32
		for j := 0; j < G; j += 4 {
			s0 += float32(qs[j]) * xs[j]
			s1 += float32(qs[j+1]) * xs[j+1]
			s2 += float32(qs[j+2]) * xs[j+2]
			s3 += float32(qs[j+3]) * xs[j+3]
		}
		acc += scales[g]*((s0+s1)+(s2+s3)) + biases[g]*xsum[g]
	}
	return acc
}

func dotQ4(q []byte, scales, biases, x, xsum []float32) float32 {
	const G = format.GroupSize
	var acc float32
	biases = biases[:len(scales)]
	xsum = xsum[:len(scales)]
	for g := range scales {
		// Fixed-size array views let the compiler drop every bounds check
		// in the inner loop.
		qs := (*[G / 2]byte)(q[g*G/2:])
		lo := (*[G / 2]float32)(x[g*G:])
		hi := (*[G / 2]float32)(x[g*G+G/2:])
		var s0, s1, s2, s3 float32
		for j := 0; j < G/2; j += 2 {
			a, b := qs[j], qs[j+1]
			s0 += float32(a&15) * lo[j]
			s1 += float32(a>>4) * hi[j]
			s2 += float32(b&15) * lo[j+1]
			s3 += float32(b>>4) * hi[j+1]
		}
		acc += scales[g]*((s0+s2)+(s1+s3)) + biases[g]*xsum[g]
	}
	return acc
}
