//go:build amd64

package kernels

// lowRows is the low-bit decode kernel (lowbit_amd64.s): n (a multiple of
// 8) rows of b bits (3 or 2), qstride bytes apart, against one activation
// row whose int8 values x8 are permuted by lowPerm[b]; out[i] is
// dotLowI8 of row i, bit for bit.
//
//go:noescape
func lowRows(q *byte, qstride int, scales, biases *float32, ng, n int, x8 *int8, xs, xsum *float32, out *float32, b int, tab *lowTab)

// lowAsm reports whether the low-bit kernel runs: AVX2 on amd64 only.
func lowAsm() bool { return useAVX2 }
