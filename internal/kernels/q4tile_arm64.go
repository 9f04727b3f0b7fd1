//go:build arm64

package kernels

import "unsafe"

// The q4 entry points of runQ4 on arm64, all on dotQ4I8NEON (one weight
// row against one activation row per call; dotQ4I8's bits).

// useVNNI is amd64's AVX-512 tile kernel: never on arm64.
var useVNNI = false

func q4TileVNNI(q *byte, qstride int, scales, biases *float32, ng, nrows, nout int, x8 *int8, xs, xsum *float32, nb int, out *float32, ostride int) {
	panic("no AVX-512 on arm64")
}

// dotQ4I8AVX2 is dotQ4I8 for one row pair.
func dotQ4I8AVX2(q *byte, scales, biases *float32, x8 *int8, xs, xsum *float32, ng int) float32 {
	return dotQ4I8NEON(q, scales, biases, x8, xs, xsum, ng, useSDOT)
}

// q4TileAVX2 computes weight rows [0,nout) of a tile (rows qstride bytes
// apart) against nb activation rows, writing row i of activation row b at
// out + b·ostride bytes + 4i.
func q4TileAVX2(q *byte, qstride int, scales, biases *float32, ng, nrows, nout int, x8 *int8, xs, xsum *float32, nb int, out *float32, ostride int) {
	for b := 0; b < nb; b++ {
		xb := (*int8)(unsafe.Add(unsafe.Pointer(x8), b*ng*64))
		xsb := (*float32)(unsafe.Add(unsafe.Pointer(xs), b*ng*4))
		xsumb := (*float32)(unsafe.Add(unsafe.Pointer(xsum), b*ng*4))
		ob := unsafe.Add(unsafe.Pointer(out), b*ostride)
		for i := 0; i < nout; i++ {
			*(*float32)(unsafe.Add(ob, 4*i)) = dotQ4I8NEON(
				(*byte)(unsafe.Add(unsafe.Pointer(q), i*qstride)),
				(*float32)(unsafe.Add(unsafe.Pointer(scales), i*ng*4)),
				(*float32)(unsafe.Add(unsafe.Pointer(biases), i*ng*4)),
				xb, xsb, xsumb, ng, useSDOT)
		}
	}
}

// q4Rows is the decode kernel: n weight rows against one activation row.
func q4Rows(q *byte, qstride int, scales, biases *float32, ng, n int, x8 *int8, xs, xsum *float32, out *float32, mode uint8) {
	o := unsafe.Slice(out, n)
	for i := range o {
		o[i] = dotQ4I8NEON(
			(*byte)(unsafe.Add(unsafe.Pointer(q), i*qstride)),
			(*float32)(unsafe.Add(unsafe.Pointer(scales), i*ng*4)),
			(*float32)(unsafe.Add(unsafe.Pointer(biases), i*ng*4)),
			x8, xs, xsum, ng, useSDOT)
	}
}
