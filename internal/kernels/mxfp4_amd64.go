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
