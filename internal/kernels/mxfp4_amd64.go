//go:build amd64

package kernels

// mxfp4Rows is the MXFP4 kernel: n consecutive weight rows (codes from q,
// nblk·16 bytes a row; scale bytes from e8, nblk a row) against one int8
// activation row (x8, scales xs), out[i] = dotMXFP4I8 of row i, bit for
// bit. avx512 selects the 512-bit integer part (AVX512BW and VNNI); the
// float chain is the same code on both.
//
//go:noescape
func mxfp4Rows(q, e8 *byte, nblk, n int, x8 *int8, xs *float32, out *float32, avx512 bool)

// mxfp4Tile is the batched AVX-512 kernel: a tile of n ≤ 16 weight rows,
// laid out by mxPrepTile, against nb activation rows, out[r·ostride/4 + i]
// = dotMXFP4I8 of row i and activation row r, bit for bit. sx12 holds
// 12·Σx8 per activation row and block.
//
//go:noescape
func mxfp4Tile(tile *byte, nblk, n int, x8 *int8, xs *float32, sx12 *int32, nb int, out *float32, ostride int)

// mxPrepTileAVX512 is mxPrepTile's rearrangement of n rows (codes q,
// qstride bytes a row, scale bytes e8) into tile, with AVX-512 gathers;
// the caller clears a partial tile first.
//
//go:noescape
func mxPrepTileAVX512(tile, q, e8 *byte, nblk, n, qstride int)

// mxfp4Tiled is the decode kernel of the tiled layout (TileMXFP4):
// ntiles whole tiles of 16 rows (codes from q, scale bytes from e8, tile
// after tile) against one activation row prepared by mxPermX (xp, sx12)
// with scales xs; out[16·t + r] = dotMXFP4I8 of the tile's row r, bit for
// bit. nblk is even.
//
//go:noescape
func mxfp4Tiled(q, e8 *byte, nblk, ntiles int, xp *int8, sx12 *int32, xs *float32, out *float32)

// mxPrepXAVX512 is mxPermX of nblk (even) blocks.
//
//go:noescape
func mxPrepXAVX512(xp *int8, sx12 *int32, x8 *int8, nblk int)

// mxPrepTileTiled is mxPrepTile's layout of one whole stored tile of the
// tiled layout (codes q, scale bytes e8).
//
//go:noescape
func mxPrepTileTiled(tile, q, e8 *byte, nblk int)

// mxTileCodesAVX512 writes the codes of one tile of 16 rows (src, rb
// bytes a row, nblk blocks) in TileMXFP4's layout to dst.
//
//go:noescape
func mxTileCodesAVX512(dst, src *byte, rb, nblk int)

// mxfp4Rows16 is the decode kernel of row-major weights 16 rows at a
// time: ntiles groups of 16 consecutive rows (codes from q, scale bytes
// from e8, the groups one after another) against one activation row
// prepared by mxPermRows (xq) and mxBlockSums (sx12) with scales xs;
// out[16·t + r] = dotMXFP4I8 of the group's row r, bit for bit. nblk is
// even. It reads up to three bytes past each group's scale bytes: no
// group may end the matrix.
//
//go:noescape
func mxfp4Rows16(q, e8 *byte, nblk, ntiles int, xq *int8, sx12 *int32, xs *float32, out *float32)

// mxPermRowsAVX512 reorders activations permuted by mxPrepXAVX512 into
// mxPermRows' order, in place, nblk (even) blocks.
//
//go:noescape
func mxPermRowsAVX512(xq *int8, nblk int)

// mxfp4Asm reports whether the AVX2 MXFP4 row kernels run.
func mxfp4Asm() bool { return useAVX2 }
