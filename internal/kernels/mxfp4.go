package kernels

import (
	"math"
	"sync"
	"unsafe"

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
	if useVNNI && t.nb >= mxTileMinRows && nblk > 0 {
		t.runMXFP4Tiles(lo, hi)
		return
	}
	if w.Tiled {
		if mxTiledReady(w) && t.xperm == mxPermTiled {
			for r := 0; r < t.nb; r++ {
				t.rowsMXTiled(lo, hi, r)
			}
			return
		}
		for o := lo; o < hi; o++ {
			for r := 0; r < t.nb; r++ {
				t.rowMXOne(o, r, out[r*w.Rows:])
			}
		}
		return
	}
	if useVNNI && mxRows16 && t.xperm == mxPermRowsOrder && hi-lo >= mxTileRows {
		// Groups of 16 rows, but for one whose scale bytes end less than
		// three bytes before the matrix's (the kernel's gather reads
		// them); the rest below.
		n := (hi - lo) / mxTileRows
		for n > 0 && (lo+n*mxTileRows)*nblk+3 > len(w.E8) {
			n--
		}
		if n > 0 {
			_, _ = w.Q[(lo+n*mxTileRows)*C/2-1], w.E8[(lo+n*mxTileRows)*nblk+2]
			for r := 0; r < t.nb; r++ {
				mxfp4Rows16(&w.Q[lo*C/2], &w.E8[lo*nblk], nblk, n, &t.x8p[r*C], &t.sx12[r*nblk], &t.xs[r*ng], &out[r*w.Rows+lo])
			}
			lo += n * mxTileRows
		}
	}
	if mxfp4Asm() && nblk > 0 {
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

// mxPair maps a code byte to its two values as mxCode+12, the low nibble's
// in the low byte: a tile's layout, two values at a time.
var mxPair = func() (t [256]uint16) {
	for b := range t {
		t[b] = uint16(mxCode[b&15]+12) | uint16(mxCode[b>>4]+12)<<8
	}
	return
}()

// mxTileMinRows is the batch from which the AVX-512 tile kernel, which
// rearranges 16 weight rows before using them nb times, replaces the
// row kernel.
const mxTileMinRows = 4

// mxTileBytes is the size of one block of a tile (see mxPrepTile).
const mxTileBytes = 576

// mxTileBufs recycles the tile and block-sum buffers of runMXFP4Tiles, one
// per thread in use, so that batched products allocate nothing once warm.
var mxTileBufs = sync.Pool{New: func() any { return new([]int32) }}

// runMXFP4Tiles computes rows [lo,hi) for every activation row with the
// AVX-512 tile kernel, 16 weight rows a tile.
func (t *matmulTask) runMXFP4Tiles(lo, hi int) {
	w := t.w
	C := w.Cols
	nblk := C / format.MXBlock
	bp := mxTileBufs.Get().(*[]int32)
	need := nblk*mxTileBytes/4 + t.nb*nblk
	if cap(*bp) < need {
		*bp = make([]int32, need)
	}
	buf := (*bp)[:need]
	tile := unsafe.Slice((*byte)(unsafe.Pointer(&buf[0])), nblk*mxTileBytes)
	sx12 := t.sx12 // Scratch.prepare's, once a product
	if len(sx12) < t.nb*nblk {
		sx12 = buf[nblk*mxTileBytes/4:]
		for r := 0; r < t.nb; r++ {
			mxBlockSums(sx12[r*nblk:(r+1)*nblk], t.x8[r*C:(r+1)*C])
		}
	}
	out := t.out[:t.nb*w.Rows]
	whole := w.Rows / mxTileRows * mxTileRows // a tiled matrix's stored tiles end here
	for w0 := lo; w0 < hi; {
		n := min(16, hi-w0)
		switch {
		case w.Tiled && w0%mxTileRows == 0 && w0+mxTileRows <= min(hi, whole):
			mxPrepTileTiled(&tile[0], &w.Q[w0*C/2], &w.E8[w0*nblk], nblk)
		case w.Tiled && w0 < whole:
			// Up to the next stored tile's start, gathered.
			n = min(n, (w0/mxTileRows+1)*mxTileRows-w0)
			mxPrepTileRows(tile, w, w0, n)
		default:
			mxPrepTile(tile, w, w0, n)
		}
		mxfp4Tile(&tile[0], nblk, n, &t.x8[0], &t.xs[0], &sx12[0], t.nb, &out[w0], 4*w.Rows)
		w0 += n
	}
	mxTileBufs.Put(bp)
}

// mxGatherBufs recycles mxPrepTileRows' room for gathered rows.
var mxGatherBufs = sync.Pool{New: func() any { return new([]byte) }}

// mxPrepTileRows is mxPrepTile for n rows of a tiled matrix from w0, which
// lie in one stored tile: gathered row-major first.
func mxPrepTileRows(tile []byte, w *Mat, w0, n int) {
	C := w.Cols
	rb, nblk := C/2, C/format.MXBlock
	bp := mxGatherBufs.Get().(*[]byte)
	defer mxGatherBufs.Put(bp)
	if cap(*bp) < n*(rb+nblk) {
		*bp = make([]byte, n*(rb+nblk))
	}
	buf := (*bp)[:n*(rb+nblk)]
	flat := Mat{Rows: n, Cols: C, Kind: format.MXFP4, Q: buf[:n*rb], E8: buf[n*rb:]}
	for i := range n {
		q, e8 := w.rowMX(w0+i, flat.Q[i*rb:(i+1)*rb], flat.E8[i*nblk:(i+1)*nblk])
		copy(flat.Q[i*rb:], q)
		copy(flat.E8[i*nblk:], e8)
	}
	mxPrepTile(tile, &flat, 0, n)
}

// mxPrepTile lays out weight rows [w0, w0+n) for mxfp4Tile: per block, for
// k = 0..7, each of 16 rows' codes of values 4k..4k+3 as mxCode+12 (4
// bytes a row, 64 a k), then the 16 rows' mxScale factors as float32.
// Rows past n are zero.
func mxPrepTile(tile []byte, w *Mat, w0, n int) {
	C := w.Cols
	nblk := C / format.MXBlock
	if n < 16 {
		clear(tile)
	}
	if useVNNI {
		mxPrepTileAVX512(&tile[0], &w.Q[w0*C/2], &w.E8[w0*nblk], nblk, n, C/2)
		return
	}
	for i := 0; i < n; i++ {
		q := w.Q[(w0+i)*C/2 : (w0+i+1)*C/2]
		e8 := w.E8[(w0+i)*nblk : (w0+i+1)*nblk]
		for b, s := range e8 {
			tb := (*[mxTileBytes]byte)(tile[b*mxTileBytes:])
			qb := (*[16]byte)(q[b*16:])
			for k := 0; k < 8; k++ {
				*(*uint32)(unsafe.Pointer(&tb[k*64+i*4])) = uint32(mxPair[qb[2*k]]) | uint32(mxPair[qb[2*k+1]])<<16
			}
			*(*float32)(unsafe.Pointer(&tb[512+4*i])) = mxScale[s]
		}
	}
}
