package kernels

import (
	"math"

	"github.com/sluicelm/sluice/internal/format"
)

// MXFP4 products (format.MXFP4 weights) use the q4 design's int8
// activations (QuantizeRow8, groups of 64) and an integer dot product per
// block of 32. An E2M1 code doubled is an integer, mxCode, in [-12, 12],
// so a weight is exactly mxCode·2^(s−128) and a block's product with x8
// is an exact int32. The float part, the arithmetic every path reproduces
// bit for bit, is per block b of the row, in order from acc = 0:
//
//	c   = mxScale[s_b] · xs[b/2]
//	acc = acc + float32(Σ mxCode·x8) · c
//
// each operation rounded to float32 on its own, no fused multiply-add.
// mxScale[s] = 2^(s−128) is a power of two, so c is exact unless it
// leaves float32's normal range, and the same in every path regardless.

// mxCode are the E2M1 values doubled, by code.
var mxCode = [16]int8{0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12}

// mxScale[s] is 2^(s−128): the weight of one unit of mxCode in a block of
// scale byte s. Byte 255 (E8M0's NaN, which the packer never writes)
// maps to 2^127.
var mxScale = func() (t [256]float32) {
	for s := range t {
		t[s] = float32(math.Ldexp(1, s-128))
	}
	return
}()

// dotMXFP4I8 is one MXFP4 weight row (codes q, scale bytes e8) times one
// int8 activation row: the reference arithmetic of every MXFP4 kernel.
func dotMXFP4I8(q, e8 []byte, x8 []int8, xs []float32) float32 {
	const B = format.MXBlock
	var acc float32
	for b, s := range e8 {
		qs := (*[B / 2]byte)(q[b*B/2:])
		xb := (*[B]int8)(x8[b*B:])
		var sum int32
		for k, v := range qs {
			sum += int32(mxCode[v&15])*int32(xb[2*k]) + int32(mxCode[v>>4])*int32(xb[2*k+1])
		}
		c := float32(mxScale[s] * xs[b/2])
		acc += float32(float32(sum) * c)
	}
	return acc
}

// runMXFP4 computes rows [lo,hi) of an MXFP4 product for every activation
// row: the assembly kernel runs a span of weight rows per activation row,
// the Go twin one dot product at a time. Results are dotMXFP4I8's.
func (t *matmulTask) runMXFP4(lo, hi int) {
	w := t.w
	C := w.Cols
	nblk, ng := C/format.MXBlock, C/format.GroupSize
	if hi <= lo || t.nb == 0 {
		return
	}
	out := t.out[:t.nb*w.Rows]
	if useAVX2 && nblk > 0 {
		_, _ = w.Q[hi*C/2-1], w.E8[hi*nblk-1]
		_, _ = t.x8[t.nb*C-1], t.xs[t.nb*ng-1]
		// Spans of weight rows small enough to stay in cache while every
		// activation row passes over them.
		span := max(1, 32<<10/(C/2+nblk))
		for o := lo; o < hi; o += span {
			n := min(span, hi-o)
			for r := 0; r < t.nb; r++ {
				mxfp4Rows(&w.Q[o*C/2], &w.E8[o*nblk], nblk, n, &t.x8[r*C], &t.xs[r*ng], &out[r*w.Rows+o], useVNNI)
			}
		}
		return
	}
	for o := lo; o < hi; o++ {
		for r := 0; r < t.nb; r++ {
			out[r*w.Rows+o] = dotMXFP4I8(w.Q[o*C/2:(o+1)*C/2], w.E8[o*nblk:(o+1)*nblk], t.x8[r*C:(r+1)*C], t.xs[r*ng:(r+1)*ng])
		}
	}
}
