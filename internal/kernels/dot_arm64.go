//go:build arm64

package kernels

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// On arm64 the kernels' amd64 entry points (the *AVX2 names the dispatch
// uses) are NEON assembly where it has been written (dot_arm64.s: the f32,
// bf16 and q8 dots, axpy, the attention value mix (and its continued
// chains, one or two outputs), the delta-rule step, the
// q4 int8 products and the int8 quantiser; q4tile_arm64.s, ops_arm64.s and
// vec_arm64.s) and calls of the Go twins elsewhere. Either way each
// computes its twin's arithmetic bit for bit, so logits are the same bits
// as on amd64. SLUICE_NOSIMD selects the Go twins throughout, as on amd64.
var useAVX2 = true

// useSDOT selects SDOT (the dot-product extension, ARMv8.4 and many v8.2
// cores) for the q4 integer sums; without it they use SMULL/SMLAL. Both
// are exact, so the results do not depend on it.
var useSDOT = cpu.ARM64.HasASIMDDP

//go:noescape
func dotF32NEON(w, x *float32, n int) float32

//go:noescape
func dotBF16NEON(w *uint16, x *float32, n int) float32

//go:noescape
func axpyNEON(y *float32, a float32, x *float32, n int)

//go:noescape
func mixAccNEON(o, v *float32, stride, n, hd int, p *float32)

//go:noescape
func mixAcc2NEON(o1, o2, v *float32, stride, n, hd int, p1, p2 *float32)

//go:noescape
func deltaRuleNEON(S, k, q, v, kv, o *float32, decay, beta float32, dk, dv int)

//go:noescape
func dotQ8NEON(q *byte, scales, biases, x, xsum *float32, ng int) float32

//go:noescape
func quantizeRow8NEON(x8 *int8, xs, x *float32, ng int)

//go:noescape
func dotQ4I8NEON(q *byte, scales, biases *float32, x8 *int8, xs, xsum *float32, ng int, sdot bool) float32

func f32s2(p *float32, n int) []float32 { return unsafe.Slice(p, n) }

func dotF32AVX2(w, x *float32, n int) float32          { return dotF32NEON(w, x, n) }
func dotBF16AVX2(w *uint16, x *float32, n int) float32 { return dotBF16NEON(w, x, n) }

func dotQ4AVX2(q *byte, scales, biases, x, xsum *float32, ng int) float32 {
	const G = 64
	return dotQ4(unsafe.Slice(q, ng*G/2), f32s2(scales, ng), f32s2(biases, ng), f32s2(x, ng*G), f32s2(xsum, ng))
}

func dotQ8AVX2(q *byte, scales, biases, x, xsum *float32, ng int) float32 {
	return dotQ8NEON(q, scales, biases, x, xsum, ng)
}

func axpyAVX2(y *float32, a float32, x *float32, n int) { axpyNEON(y, a, x, n) }

func deltaRuleAVX2(S, k, q, v, kv, o *float32, decay, beta float32, dk, dv int) {
	deltaRuleNEON(S, k, q, v, kv, o, decay, beta, dk, dv)
}

// scoresAVX2 is out[j] = dot(q, k_j)·scale for n keys stride bytes apart:
// four keys a call of dotF32x4NEON (the query loaded once for the four,
// each sum dotF32NEON's bits) where hd is whole steps of 16, the rest one
// by one.
func scoresAVX2(q, k *float32, stride, n, hd int, scale float32, out *float32) {
	o := f32s2(out, n)
	j := 0
	if hd%16 == 0 {
		for ; j+4 <= n; j += 4 {
			dotF32x4NEON(q, (*float32)(unsafe.Add(unsafe.Pointer(k), j*stride)), stride, hd, &o[j], 4)
			o[j] *= scale
			o[j+1] *= scale
			o[j+2] *= scale
			o[j+3] *= scale
		}
	}
	for ; j < n; j++ {
		o[j] = dotF32NEON(q, (*float32)(unsafe.Add(unsafe.Pointer(k), j*stride)), hd) * scale
	}
}

// scores3AVX2 is three scoresAVX2.
func scores3AVX2(q *float32, qStride int, k *float32, stride, n, hd int, scale float32, out *float32, outStride int) {
	for h := range 3 {
		scoresAVX2((*float32)(unsafe.Add(unsafe.Pointer(q), h*qStride)), k, stride, n, hd, scale, (*float32)(unsafe.Add(unsafe.Pointer(out), h*outStride)))
	}
}

// mixAVX2 is mixAccAVX2 from cleared chains (+0), as on amd64.
func mixAVX2(o, v *float32, stride, n, hd int, p *float32) {
	clear(unsafe.Slice(o, hd))
	mixAccNEON(o, v, stride, n, hd, p)
}

func mixAccAVX2(o, v *float32, stride, n, hd int, p *float32) { mixAccNEON(o, v, stride, n, hd, p) }

func mixAcc2AVX2(o1, o2, v *float32, stride, n, hd int, p1, p2 *float32) {
	mixAcc2NEON(o1, o2, v, stride, n, hd, p1, p2)
}

func expSubAVX2(s *float32, n int, mx float32) float32 { return expSubNEON(s, n, mx) }

func quantizeRow8AVX2(x8 *int8, xs, x *float32, ng int) { quantizeRow8NEON(x8, xs, x, ng) }
