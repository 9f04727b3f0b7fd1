//go:build amd64

package kernels

import "golang.org/x/sys/cpu"

// lowRows is the low-bit decode kernel (lowbit_amd64.s): n (a multiple of
// 8) rows of b bits (3 or 2), qstride bytes apart, against one activation
// row whose int8 values x8 are permuted by lowPerm[b]; out[i] is
// dotLowI8 of row i, bit for bit.
//
//go:noescape
func lowRows(q *byte, qstride int, scales, biases *float32, ng, n int, x8 *int8, xs, xsum *float32, out *float32, b int, tab *lowTab)

// lowRowsVNNI is lowRows for n a multiple of 16, with AVX-512
// (lowbit_avx512_amd64.s): the same arguments, the same permuted
// activations and the same results.
//
//go:noescape
func lowRowsVNNI(q *byte, qstride int, scales, biases *float32, ng, n int, x8 *int8, xs, xsum *float32, out *float32, b int, tab *lowTab)

// lowAsm reports whether the low-bit kernel runs: AVX2 on amd64 only.
func lowAsm() bool { return useAVX2 }

// lowVNNI reports whether lowRowsVNNI runs for width b: with the AVX-512
// q4 kernels (useVNNI, which SLUICE_NOAVX512 turns off), and for q3 with
// AVX512_VBMI besides, whose byte permutes unpack it (Cascade Lake has
// VNNI without VBMI and keeps the AVX2 kernel for q3).
func lowVNNI(b int) bool { return useVNNI && (b == 2 || cpu.X86.HasAVX512VBMI) }
