//go:build !amd64 && !arm64

package kernels

var useVNNI = false

// splitZMM and amdZMM are the amd64 flags of the same names, never set
// here.
const splitZMM, amdZMM = false, false

func q4TileVNNI(q *byte, qstride int, scales, biases *float32, ng, nrows, nout int, x8 *int8, xs, xsum *float32, nb int, out *float32, ostride int) {
	panic("no AVX-512")
}

func dotQ4I8AVX2(q *byte, scales, biases *float32, x8 *int8, xs, xsum *float32, ng int) float32 {
	panic("no AVX2")
}

func q4TileAVX2(q *byte, qstride int, scales, biases *float32, ng, nrows, nout int, x8 *int8, xs, xsum *float32, nb int, out *float32, ostride int) {
	panic("no AVX2")
}

func q4Rows(q *byte, qstride int, scales, biases *uint16, ng, n int, x8 *int8, xs, xsum *float32, out *float32, mode uint8, room *[]float32) {
	panic("no AVX2")
}

// q4RowsTiles is false: this q4Rows reads row-major weights only, so a
// tiled matrix's rows are gathered one at a time (TiledQ4 never asks for
// one here).
const q4RowsTiles = false

// untileAVX2 is amd64's: untile calls it only where q4RowsTiles is set.
func untileAVX2(dst *byte, rb int, src *byte, ng int) { panic("unreachable") }

// q4RowsPaired is q4Rows over the rows of q and then of pair: one stream
// at a time here (amd64's reads both at once).
func q4RowsPaired(q *byte, qstride int, scales, biases *uint16, ng, n int, x8 *int8, xs, xsum *float32, out *float32, mode uint8, room *[]float32, pair *q4Pair) {
	q4Rows(q, qstride, scales, biases, ng, n, x8, xs, xsum, out, mode, room)
	q4Rows(pair.q, qstride, pair.scales, pair.biases, ng, n, x8, xs, xsum, pair.out, mode, room)
}
