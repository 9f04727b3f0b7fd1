//go:build amd64

package kernels

import (
	"os"

	"golang.org/x/sys/cpu"
)

// useVNNI selects the AVX-512 q4 tile kernel (VPDPBUSD on 512-bit
// registers). It needs AVX512F, BW and VL besides VNNI; SLUICE_NOAVX512 in
// the environment falls back to the AVX2 kernels, for comparison, and
// SLUICE_NOSIMD to the pure-Go ones. Every path gives the same bits.
var useVNNI = cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512VL &&
	cpu.X86.HasAVX512VNNI && cpu.X86.HasAVX2 && cpu.X86.HasFMA &&
	os.Getenv("SLUICE_NOAVX512") == "" && os.Getenv("SLUICE_NOSIMD") == ""

// splitZMM is set on CPUs that issue each 512-bit operation as two
// 256-bit halves (halfWideZMM), where the decode kernel's 512-bit variant
// saves instructions but not cycles and reads memory more slowly than the
// 256-bit one (q4RowsMode).
var splitZMM = useVNNI && halfWideZMM()

// amdZMM is set on AMD CPUs with the 512-bit variant (Zen 5 and later),
// whose decode reads the tiled layout on 256-bit registers faster than
// row-major rows on 512-bit ones (TiledQ4).
var amdZMM = useVNNI && !splitZMM && amdCPU()

// q4TileVNNI computes a tile of 16 weight rows against nb activation rows
// (see q4tile_amd64.s for the arguments); each result is dotQ4I8's.
//
//go:noescape
func q4TileVNNI(q *byte, qstride int, scales, biases *float32, ng, nrows, nout int, x8 *int8, xs, xsum *float32, nb int, out *float32, ostride int)

// q4TileAVX2 is q4TileVNNI for tiles of 8 rows, with AVX2 alone.
//
//go:noescape
func q4TileAVX2(q *byte, qstride int, scales, biases *float32, ng, nrows, nout int, x8 *int8, xs, xsum *float32, nb int, out *float32, ostride int)

// q4RowsAsm is q4Rows, and with a pair (only where mode has q4RowsTiled,
// q4RowsZMM and q4RowsPrefetch) also q4RowsPaired.
//
//go:noescape
func q4RowsAsm(q *byte, qstride int, scales, biases *uint16, ng, n int, x8 *int8, xs, xsum *float32, out *float32, mode uint8, room *[]float32, pair *q4Pair)

// q4Rows is the decode kernel: n (a multiple of 8) weight rows against one
// activation row, without rearranging the weights, their scales and biases
// the packed format's halves, which it widens itself (room, for arm64's
// kernels, is unused); mode picks its variant (q4RowsVNNI,
// q4RowsPrefetch, q4RowsZMM), all with the same results.
func q4Rows(q *byte, qstride int, scales, biases *uint16, ng, n int, x8 *int8, xs, xsum *float32, out *float32, mode uint8, room *[]float32) {
	q4RowsAsm(q, qstride, scales, biases, ng, n, x8, xs, xsum, out, mode, room, nil)
}

// q4RowsPaired is q4Rows over n rows and n more of the same shape (pair),
// a tile of each a step, against the same activations: two streams of
// loads in flight where one leaves the memory waiting. The results are
// q4Rows's on each, bit for bit. Both in one pass only where mode reads
// tiles on Z registers (q4PairMode); otherwise one after the other.
func q4RowsPaired(q *byte, qstride int, scales, biases *uint16, ng, n int, x8 *int8, xs, xsum *float32, out *float32, mode uint8, room *[]float32, pair *q4Pair) {
	if !q4PairMode(mode) {
		q4Rows(q, qstride, scales, biases, ng, n, x8, xs, xsum, out, mode, room)
		q4Rows(pair.q, qstride, pair.scales, pair.biases, ng, n, x8, xs, xsum, pair.out, mode, room)
		return
	}
	q4RowsAsm(q, qstride, scales, biases, ng, n, x8, xs, xsum, out, mode, room, pair)
}

// untileAVX2 writes a tile of 8 rows of rb bytes (ng groups), tiled at
// src, row-major to dst (untile).
//
//go:noescape
func untileAVX2(dst *byte, rb int, src *byte, ng int)

// q4RowsTiles says q4Rows reads the tiled layout (mode q4RowsTiled).
const q4RowsTiles = true
