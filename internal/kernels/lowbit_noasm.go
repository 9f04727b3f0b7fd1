//go:build !amd64

package kernels

// lowAsm: the low-bit kernel exists on amd64 only; elsewhere (arm64
// included, whose useAVX2 means NEON) the Go twin runs.
func lowAsm() bool { return false }

// lowVNNI: so does its AVX-512 variant.
func lowVNNI(b int) bool { return false }

func lowRows(q *byte, qstride int, scales, biases *float32, ng, n int, x8 *int8, xs, xsum *float32, out *float32, b int, tab *lowTab) {
	panic("no AVX2")
}

func lowRowsVNNI(q *byte, qstride int, scales, biases *float32, ng, n int, x8 *int8, xs, xsum *float32, out *float32, b int, tab *lowTab) {
	panic("no AVX-512")
}
