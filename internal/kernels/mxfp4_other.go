//go:build !amd64

package kernels

// mxfp4Asm: the MXFP4 row kernels exist on amd64 only; elsewhere (arm64
// included, whose useAVX2 means NEON) the Go twin runs.
func mxfp4Asm() bool { return false }

func mxfp4Rows(q, e8 *byte, nblk, n int, x8 *int8, xs *float32, out *float32, avx512 bool) {
	panic("no AVX2")
}

func mxfp4Tile(tile *byte, nblk, n int, x8 *int8, xs *float32, sx12 *int32, nb int, out *float32, ostride int) {
	panic("no AVX-512")
}

func mxPrepTileAVX512(tile, q, e8 *byte, nblk, n, qstride int) { panic("no AVX-512") }

func mxfp4Tiled(q, e8 *byte, nblk, ntiles int, xp *int8, sx12 *int32, xs *float32, out *float32) {
	panic("no AVX-512")
}

func mxPrepXAVX512(xp *int8, sx12 *int32, x8 *int8, nblk int) { panic("no AVX-512") }

func mxPrepTileTiled(tile, q, e8 *byte, nblk int) { panic("no AVX-512") }

func mxTileCodesAVX512(dst, src *byte, rb, nblk int) { panic("no AVX-512") }

func mxfp4Rows16(q, e8 *byte, nblk, ntiles int, xq *int8, sx12 *int32, xs *float32, out *float32) {
	panic("no AVX-512")
}

func mxPermRowsAVX512(xq *int8, nblk int) { panic("no AVX-512") }
