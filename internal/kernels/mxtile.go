package kernels

import (
	"os"

	"github.com/sluicelm/sluice/internal/format"
)

// The tiled MXFP4 layout (Mat.Tiled with Kind format.MXFP4) serves the
// decode kernel mxfp4Tiled, which the row-major layout starves: a row's
// blocks each end in a float multiply-add of their own, in block order,
// so the row kernel (mxfp4Rows) reduces every block's integer sum across
// lanes and then waits on one serial chain of scalar adds a row. On a
// 2-core Zen 5 it read 2880×2880 matrices from memory at 11-12 GB/s on
// one thread, where the tiled q4 kernel read 30 and plain reads 36
// (BenchmarkMXFP4DecodeDRAM, BenchmarkQ4DecodeDRAM, BenchmarkMemBW). In
// the tiled layout each of 16 rows owns a 32-bit lane: VPDPBUSD adds a
// block's codes times the activations broadcast straight into the rows'
// lanes, and the float part (dotMXFP4I8's, in the same order) runs on 16
// rows at once. Only the bytes' order changes, so every product gives
// the same bits in either layout.

// The orders of a product's permuted activations (matmulTask.xperm):
// mxPermX's for the tiled kernel, mxPermRows' for mxfp4Rows16.
const (
	mxPermTiled = 1 + iota
	mxPermRowsOrder
)

// mxRows16 lets row-major MXFP4 products take mxfp4Rows16; false leaves
// them to the row kernel alone, for benchmarks.
var mxRows16 = true

// mxTileRows is the rows of a tile in the tiled MXFP4 layout.
const mxTileRows = 16

// mxBlockBytes is one row's code bytes of a block.
const mxBlockBytes = format.MXBlock / 2

// TiledMXFP4 reports whether loaders should tile the MXFP4 matrices they
// own: where the AVX-512 VNNI kernel that reads the layout runs.
// SLUICE_FLATMXFP4 in the environment keeps them row-major, for
// comparison.
func TiledMXFP4() bool { return tiledMX && useVNNI }

var tiledMX = os.Getenv("SLUICE_FLATMXFP4") == ""

// TiledKind reports whether loaders should tile matrices of kind k
// (Tiles, Tile): TiledQ4 for q4, TiledMXFP4 for MXFP4, never otherwise.
func TiledKind(k format.Kind) bool {
	switch k {
	case format.Q4:
		return TiledQ4()
	case format.MXFP4:
		return TiledMXFP4()
	}
	return false
}

// Tile rearranges m's weights into the tiled layout of its kind in place
// (TileQ4, TileMXFP4) when Tiles(m), and marks m tiled; tmp is scratch,
// returned for the next call. A matrix tiled already (as its store
// holds it) is left as it is.
func Tile(m *Mat, tmp []byte) []byte {
	if m.Tiled || !Tiles(m) {
		return tmp
	}
	if m.Kind == format.MXFP4 {
		tmp = TileMXFP4(m.Q, m.E8, m.Rows, m.Cols, tmp)
	} else {
		tmp = TileQ4(m.Q, m.Rows, m.Cols, tmp)
	}
	m.Tiled = true
	return tmp
}

// Untile rearranges a tiled q4 matrix back to row-major order in place
// and marks it so, for a CPU whose decode kernel reads rows (TiledQ4
// false) holding its own copy of a store tiled elsewhere; tmp is scratch,
// returned for the next call. Other matrices are left as they are.
func Untile(m *Mat, tmp []byte) []byte {
	if !m.Tiled || m.Kind != format.Q4 {
		return tmp
	}
	tmp = UntileQ4(m.Q, m.Rows, m.Cols, tmp)
	m.Tiled = false
	return tmp
}

// StoreTiles reports whether a packer that tiles its q4 expert records
// stores the matrix t tiled (format.Tensor.Tiled): where Tiles would tile
// it on this CPU. Only q4 is stored tiled; MXFP4's tiled layout serves
// one CPU family alone, and is still made as records land.
func StoreTiles(t *format.Tensor) bool {
	if t.Kind != format.Q4 || len(t.Shape) != 2 {
		return false
	}
	return Tiles(&Mat{Kind: t.Kind, Rows: t.Rows(), Cols: t.Cols()})
}

// TileMXFP4 rearranges the row-major MXFP4 codes q ([rows][cols/2]) and
// scale bytes e8 ([rows][cols/32]) of a matrix into the tiled layout, in
// place. Within each whole tile of 16 rows, block b's codes take the 256
// bytes at b·256 from the tile's first code byte, and in them bytes
// 4j..4j+3 of row r's block (dword j) sit at j·64 + r·4: line j holds
// dword j of every row, which the kernel multiplies by the activations'
// matching values broadcast. The tile's scale bytes become [blocks][16],
// block b's at b·16 + r from the tile's first scale byte. Rows after the
// last whole tile stay row-major. tmp is scratch of 16·cols/2 bytes,
// grown when short and returned for the next call.
func TileMXFP4(q, e8 []byte, rows, cols int, tmp []byte) []byte {
	rb, nblk := cols/2, cols/format.MXBlock
	tb := mxTileRows * rb
	if cap(tmp) < tb {
		tmp = make([]byte, tb)
	}
	tmp = tmp[:tb]
	for t := 0; t+mxTileRows <= rows; t += mxTileRows {
		src := q[t*rb : t*rb+tb]
		if useVNNI && nblk > 0 {
			mxTileCodesAVX512(&tmp[0], &src[0], rb, nblk) // 3.4x the loop below (BenchmarkTileMXFP4)
		} else {
			for r := range mxTileRows {
				row := src[r*rb : r*rb+rb]
				for b := range nblk {
					for j := range 4 {
						*(*[4]byte)(tmp[mxAt(b, r, j):]) = *(*[4]byte)(row[b*mxBlockBytes+4*j:])
					}
				}
			}
		}
		copy(src, tmp)
		es := e8[t*nblk : (t+mxTileRows)*nblk]
		et := tmp[:len(es)]
		for r := range mxTileRows {
			er := es[r*nblk : (r+1)*nblk]
			for b, v := range er {
				et[b*mxTileRows+r] = v
			}
		}
		copy(es, et)
	}
	return tmp
}

// mxAt is the offset of dword j of row r's block b from its tile's first
// code byte.
func mxAt(b, r, j int) int { return b*mxTileRows*mxBlockBytes + j*64 + r*4 }

// rowMX returns row r's codes and scale bytes in row-major order: views of
// Q and E8, or, for a row inside a tile of a tiled matrix, the row
// gathered into qb and eb (heap buffers where those are short).
func (m *Mat) rowMX(r int, qb, eb []byte) (q, e8 []byte) {
	rb, nblk := m.Cols/2, m.Cols/format.MXBlock
	if !m.Tiled || r >= m.Rows/mxTileRows*mxTileRows {
		return m.Q[r*rb : (r+1)*rb], m.E8[r*nblk : (r+1)*nblk]
	}
	if len(qb) < rb {
		qb = make([]byte, rb)
	}
	if len(eb) < nblk {
		eb = make([]byte, nblk)
	}
	q, e8 = qb[:rb], eb[:nblk]
	t0 := r / mxTileRows * mxTileRows
	tile := m.Q[t0*rb:][:mxTileRows*rb]
	et := m.E8[t0*nblk:][:mxTileRows*nblk]
	for b := range nblk {
		for j := range 4 {
			*(*[4]byte)(q[b*mxBlockBytes+4*j:]) = *(*[4]byte)(tile[mxAt(b, r%mxTileRows, j):])
		}
		e8[b] = et[b*mxTileRows+r%mxTileRows]
	}
	return q, e8
}

// mxPermX writes x8 in the order the tiled kernel broadcasts it: within
// each 8 values, the even ones (the low nibbles of a code dword) then the
// odd ones (the high nibbles), into xp; and 12·Σx8 of each block into
// sx12. The assembly does the same (mxPrepX).
func mxPermX(xp []int8, sx12 []int32, x8 []int8) {
	for c := 0; c+8 <= len(x8); c += 8 {
		for i := range 4 {
			xp[c+i], xp[c+4+i] = x8[c+2*i], x8[c+2*i+1]
		}
	}
	mxBlockSums(sx12, x8)
}

// mxBlockSums writes 12·Σx8 of each block of x8 into sx12: what the
// kernels' codes, offset by 12 to be unsigned, add beyond the true sums.
func mxBlockSums(sx12 []int32, x8 []int8) {
	for b := range len(x8) / format.MXBlock {
		var s int32
		for _, v := range x8[b*format.MXBlock : (b+1)*format.MXBlock] {
			s += int32(v)
		}
		sx12[b] = 12 * s
	}
}

// mxPermRows writes x8 in the order mxfp4Rows16 broadcasts it: within
// each block of 32, the even values of its four 8-value dwords (the low
// nibbles of the codes), then the odd ones; and the blocks' sums as
// mxBlockSums.
func mxPermRows(xq []int8, sx12 []int32, x8 []int8) {
	for b := 0; b+format.MXBlock <= len(x8); b += format.MXBlock {
		for j := range 4 {
			for i := range 4 {
				xq[b+4*j+i], xq[b+16+4*j+i] = x8[b+8*j+2*i], x8[b+8*j+2*i+1]
			}
		}
	}
	mxBlockSums(sx12, x8)
}

// mxPrepRows is mxPermRows, in assembly where mxfp4Rows16 runs.
func mxPrepRows(xq []int8, sx12 []int32, x8 []int8) {
	if n := len(x8); useVNNI && n > 0 && n%format.GroupSize == 0 {
		mxPrepX(xq, sx12, x8)
		mxPermRowsAVX512(&xq[0], n/format.MXBlock)
		return
	}
	mxPermRows(xq, sx12, x8)
}

// mxPrepX is mxPermX, in assembly where the tiled kernel runs.
func mxPrepX(xp []int8, sx12 []int32, x8 []int8) {
	if n := len(x8); useVNNI && n > 0 && n%format.GroupSize == 0 {
		_, _ = xp[n-1], sx12[n/format.MXBlock-1]
		mxPrepXAVX512(&xp[0], &sx12[0], &x8[0], n/format.MXBlock)
		return
	}
	mxPermX(xp, sx12, x8)
}

// mxfp4TiledGo is the Go twin of mxfp4Tiled: ntiles whole tiles (codes q,
// scale bytes e8, tile after tile) against one activation row prepared by
// mxPermX (xp, sx12) with scales xs, 16 outputs a tile. It reads the
// layout as the kernel does and reproduces dotMXFP4I8's float part.
func mxfp4TiledGo(q, e8 []byte, nblk, ntiles int, xp []int8, sx12 []int32, xs, out []float32) {
	for t := range ntiles {
		tq := q[t*nblk*mxTileRows*mxBlockBytes:]
		te := e8[t*nblk*mxTileRows:]
		for r := range mxTileRows {
			var acc float32
			for b := range nblk {
				var sum int32
				for j := range 4 {
					d := tq[mxAt(b, r, j):]
					for i := range 4 {
						sum += int32(mxCode[d[i]&15]+12)*int32(xp[b*32+8*j+i]) + int32(mxCode[d[i]>>4]+12)*int32(xp[b*32+8*j+4+i])
					}
				}
				sum -= sx12[b]
				c := float32(mxScale[te[b*mxTileRows+r]] * xs[b/2])
				acc += float32(float32(sum) * c)
			}
			out[t*mxTileRows+r] = acc
		}
	}
}

// rowsMXTiled computes rows [lo,hi) of a tiled MXFP4 matrix for activation
// row r: the whole tiles inside the range with mxfp4Tiled, the other rows
// (a part that does not start or end on a tile's boundary, the rows after
// the last tile) gathered row-major, through the row kernel.
func (t *matmulTask) rowsMXTiled(lo, hi, r int) {
	w := t.w
	C := w.Cols
	rb, nblk, ng := C/2, C/format.MXBlock, C/format.GroupSize
	a := min((lo+mxTileRows-1)/mxTileRows*mxTileRows, hi)
	n := max(min(hi, w.Rows/mxTileRows*mxTileRows)/mxTileRows*mxTileRows-a, 0)
	out := t.out[r*w.Rows:]
	if n > 0 {
		mxfp4Tiled(&w.Q[a*rb], &w.E8[a*nblk], nblk, n/mxTileRows, &t.x8p[r*C], &t.sx12[r*nblk], &t.xs[r*ng], &out[a])
	}
	for o := lo; o < hi; o++ {
		if o == a && n > 0 {
			o += n - 1
			continue
		}
		t.rowMXOne(o, r, out)
	}
}

// rowMXOne computes row o for activation row r into out[o], gathering the
// row of a tiled matrix first.
func (t *matmulTask) rowMXOne(o, r int, out []float32) {
	w := t.w
	C := w.Cols
	nblk, ng := C/format.MXBlock, C/format.GroupSize
	var qb [rowQRoom]byte
	var eb [rowQRoom / mxBlockBytes]byte
	q, e8 := w.rowMX(o, qb[:], eb[:])
	if mxfp4Asm() && nblk > 0 {
		mxfp4Rows(&q[0], &e8[0], nblk, 1, &t.x8[r*C], &t.xs[r*ng], &out[o], useVNNI)
		return
	}
	out[o] = dotMXFP4I8(q, e8, t.x8[r*C:(r+1)*C], t.xs[r*ng:(r+1)*ng])
}

// mxTiledReady reports whether products with w take the tiled kernels:
// w is tiled and the AVX-512 VNNI kernels run. Otherwise a tiled matrix's
// rows are gathered one at a time.
func mxTiledReady(w *Mat) bool { return w.Tiled && useVNNI }
