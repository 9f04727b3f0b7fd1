package kernels

import (
	"unsafe"

	"github.com/sluicelm/sluice/internal/format"
	"github.com/sluicelm/sluice/internal/quant"
)

// The packed format stores quantisation scales and biases as halves (format
// 3). amd64's decode kernel (q4Rows) widens them itself as it loads them;
// the other kernels take float32 ones: each part of a product widens the
// scales and biases of a few rows at a time into a small buffer (exactly:
// every half is a float32) and hands the kernels that buffer. The weights,
// the bulk of the bytes, are read where they lie.

// scaleRoom is the floats of widened scales and biases a part of a product
// widens at once: 16 rows of 128 groups (8192 columns) each, 16 KiB, which
// stays in L1 between the widening and the kernel. Each part of a product
// has its room in the Scratch (see matmulTask.room): kept from product to
// product, so a step allocates nothing, and never shared, since no two
// threads run one part at once.
const scaleRoom = 4096

// widenHalf writes src's halves as float32 into dst.
func widenHalf(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	n := 0
	if useAVX2 && hasHalfSIMD {
		n = len(src) &^ 7
		if n > 0 {
			widenHalfSIMD(&dst[0], &src[0], n)
		}
	}
	for i := n; i < len(src); i++ {
		dst[i] = quant.F16ToF32(src[i])
	}
}

// widen returns the scales and biases of rows [lo,hi) of m as float32, each
// [hi-lo][groups], in *room, which it first enlarges if they do not fit.
func (m *Mat) widen(room *[]float32, lo, hi int) (s, b []float32) {
	ng := m.Cols / format.GroupSize
	return widenPair(room, m.Scales[lo*ng:hi*ng], m.Biases[lo*ng:hi*ng])
}

// widenPair widens the halves sh and bh (of equal length) into *room,
// enlarging it first if they do not fit.
func widenPair(room *[]float32, sh, bh []uint16) (s, b []float32) {
	n := len(sh)
	if 2*n > len(*room) {
		*room = make([]float32, 2*n)
	}
	buf := *room
	s, b = buf[:n:n], buf[n:2*n:2*n]
	widenHalf(s, sh)
	widenHalf(b, bh)
	return s, b
}

// rowsPerWiden is how many rows' scales and biases, a multiple of t (and at
// least t), to widen at once into a room of scaleRoom floats.
func rowsPerWiden(ng, t int) int {
	return max(t, scaleRoom/(2*max(ng, 1))/t*t)
}

// f16s views the n halves at the start of b (2-byte aligned: every tensor
// part of a pack is).
func f16s(b []byte, n int) []uint16 {
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*uint16)(unsafe.Pointer(&b[0])), n)
}
