//go:build arm64

package kernels

import "unsafe"

// The q4 entry points of runQ4 on arm64: q4QuadsNEON (q4tile_arm64.s) for
// whole quads of weight rows, dotQ4I8NEON for the one to three rows left
// over; both give dotQ4I8's bits.

// useVNNI is amd64's AVX-512 tile kernel: never on arm64.
var useVNNI = false

// splitZMM and amdZMM are the amd64 flags of the same names, never set
// here.
const splitZMM, amdZMM = false, false

func q4TileVNNI(q *byte, qstride int, scales, biases *float32, ng, nrows, nout int, x8 *int8, xs, xsum *float32, nb int, out *float32, ostride int) {
	panic("no AVX-512 on arm64")
}

// q4QuadsNEON computes 4·nq weight rows (qstride bytes apart, their scales
// and biases ng apart) against nb activation rows, four weight rows and up
// to two activation rows per pass; row i of activation row b goes to
// out + b·ostride bytes + 4i. sdot selects SDOT for the integer sums,
// else SMULL/SMLAL; the results are the same.
//
//go:noescape
func q4QuadsNEON(q *byte, qstride int, scales, biases *float32, ng, nq int, x8 *int8, xs, xsum *float32, nb int, out *float32, ostride int, sdot bool)

// dotQ4I8AVX2 is dotQ4I8 for one row pair.
func dotQ4I8AVX2(q *byte, scales, biases *float32, x8 *int8, xs, xsum *float32, ng int) float32 {
	return dotQ4I8NEON(q, scales, biases, x8, xs, xsum, ng, useSDOT)
}

// q4TileAVX2 computes weight rows [0,nout) of a tile (rows qstride bytes
// apart) against nb activation rows, writing row i of activation row b at
// out + b·ostride bytes + 4i.
func q4TileAVX2(q *byte, qstride int, scales, biases *float32, ng, nrows, nout int, x8 *int8, xs, xsum *float32, nb int, out *float32, ostride int) {
	nq := nout / 4
	if nq > 0 {
		q4QuadsNEON(q, qstride, scales, biases, ng, nq, x8, xs, xsum, nb, out, ostride, useSDOT)
	}
	if 4*nq < nout {
		q4RowsOne(q, qstride, scales, biases, ng, 4*nq, nout, x8, xs, xsum, nb, out, ostride)
	}
}

// q4Rows is the decode kernel: n weight rows against one activation row,
// their scales and biases halves, which it widens into room a few rows at
// a time for the NEON kernels. mode (amd64's kernel variants) has no
// meaning here.
func q4Rows(q *byte, qstride int, scales, biases *uint16, ng, n int, x8 *int8, xs, xsum *float32, out *float32, mode uint8, room *[]float32) {
	sh, bh := unsafe.Slice(scales, n*ng), unsafe.Slice(biases, n*ng)
	step := rowsPerWiden(ng, 4)
	for r0 := 0; r0 < n; r0 += step {
		k := min(step, n-r0)
		s, b := widenPair(room, sh[r0*ng:(r0+k)*ng], bh[r0*ng:(r0+k)*ng])
		qr := (*byte)(unsafe.Add(unsafe.Pointer(q), r0*qstride))
		or := (*float32)(unsafe.Add(unsafe.Pointer(out), 4*r0))
		nq := k / 4
		if nq > 0 {
			q4QuadsNEON(qr, qstride, &s[0], &b[0], ng, nq, x8, xs, xsum, 1, or, 0, useSDOT)
		}
		if 4*nq < k {
			q4RowsOne(qr, qstride, &s[0], &b[0], ng, 4*nq, k, x8, xs, xsum, 1, or, 0)
		}
	}
}

// q4RowsOne computes weight rows [lo,hi) against nb activation rows one
// row pair at a time with dotQ4I8NEON, with q4TileAVX2's arguments.
func q4RowsOne(q *byte, qstride int, scales, biases *float32, ng, lo, hi int, x8 *int8, xs, xsum *float32, nb int, out *float32, ostride int) {
	for b := 0; b < nb; b++ {
		xb := (*int8)(unsafe.Add(unsafe.Pointer(x8), b*ng*64))
		xsb := (*float32)(unsafe.Add(unsafe.Pointer(xs), b*ng*4))
		xsumb := (*float32)(unsafe.Add(unsafe.Pointer(xsum), b*ng*4))
		ob := unsafe.Add(unsafe.Pointer(out), b*ostride)
		for i := lo; i < hi; i++ {
			*(*float32)(unsafe.Add(ob, 4*i)) = dotQ4I8NEON(
				(*byte)(unsafe.Add(unsafe.Pointer(q), i*qstride)),
				(*float32)(unsafe.Add(unsafe.Pointer(scales), i*ng*4)),
				(*float32)(unsafe.Add(unsafe.Pointer(biases), i*ng*4)),
				xb, xsb, xsumb, ng, useSDOT)
		}
	}
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
