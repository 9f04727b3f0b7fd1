//go:build amd64

package kernels

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// useAVX2 selects the assembly kernels; the pure-Go loops remain as their
// scalar twins and as the path for CPUs without AVX2 and FMA. SLUICE_NOSIMD
// in the environment forces the pure-Go path (see simd.go).
var useAVX2 = cpu.X86.HasAVX2 && cpu.X86.HasFMA

// dotQ4AVX2 is Σ_g scale[g]·(q_g·x_g) + Σ_g bias[g]·xsum[g] over ng groups of
// 64 (format.Q4 packing).
//
//go:noescape
func dotQ4AVX2(q *byte, scales, biases, x, xsum *float32, ng int) float32

// dotQ8AVX2 is the same for format.Q8.
//
//go:noescape
func dotQ8AVX2(q *byte, scales, biases, x, xsum *float32, ng int) float32

// dotBF16AVX2 is Σ w[i]·x[i] over n bf16 weights, n a multiple of 16.
//
//go:noescape
func dotBF16AVX2(w *uint16, x *float32, n int) float32

// dotF32AVX2 is Σ w[i]·x[i], n a multiple of 16.
//
//go:noescape
func dotF32AVX2(w, x *float32, n int) float32

// dotQ4I8AVX2 is dotQ4I8 (the integer-activation design of the q4 dot
// product) for one weight row, bit for bit.
//
//go:noescape
func dotQ4I8AVX2(q *byte, scales, biases *float32, x8 *int8, xs, xsum *float32, ng int) float32

// axpyAVX2 is y += a·x, n a multiple of 16.
//
//go:noescape
func axpyAVX2(y *float32, a float32, x *float32, n int)

//go:noescape
func deltaRuleAVX2(S, k, q, v, kv, o *float32, decay, beta float32, dk, dv int)

//go:noescape
func scoresAVX2(q, k *float32, stride, n, hd int, scale float32, out *float32)

// scores3AVX2 is scoresAVX2 for three queries qStride bytes apart over
// the same keys, their scores outStride bytes apart: each key is loaded
// once for the three. Bits of three scoresAVX2 calls.
//
//go:noescape
func scores3AVX2(q *float32, qStride int, k *float32, stride, n, hd int, scale float32, out *float32, outStride int)

// mixAVX2 is o = Σ_j p[j]·v_j over n values stride bytes apart, in j
// order: each element the FMA chain Axpy would compute, from +0.
func mixAVX2(o, v *float32, stride, n, hd int, p *float32) {
	clear(unsafe.Slice(o, hd))
	mixAccAVX2(o, v, stride, n, hd, p)
}

// mixZMM lets mixAccAVX2 take 128 elements a pass on 512-bit registers,
// where they run at full width (not splitZMM's halves).
var mixZMM = useVNNI && !splitZMM

// mixAccAVX2 is mixAVX2 continuing o's chains from their values
// (mixAccGo).
//
//go:noescape
func mixAccAVX2(o, v *float32, stride, n, hd int, p *float32)

// mixAcc2AVX2 is mixAccAVX2 for two outputs and weights over the same
// value rows, each row loaded once for both.
//
//go:noescape
func mixAcc2AVX2(o1, o2, v *float32, stride, n, hd int, p1, p2 *float32)

//go:noescape
func expSubAVX2(s *float32, n int, mx float32) float32

//go:noescape
func quantizeRow8AVX2(x8 *int8, xs, x *float32, ng int)
