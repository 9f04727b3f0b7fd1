//go:build !amd64

package kernels

func mxfp4Rows(q, e8 *byte, nblk, n int, x8 *int8, xs *float32, out *float32, avx512 bool) {
	panic("no AVX2")
}
