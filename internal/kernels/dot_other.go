//go:build !amd64 && !arm64

package kernels

var useAVX2 = false

func dotQ4AVX2(q *byte, scales, biases, x, xsum *float32, ng int) float32 { panic("no AVX2") }
func dotQ8AVX2(q *byte, scales, biases, x, xsum *float32, ng int) float32 { panic("no AVX2") }
func dotBF16AVX2(w *uint16, x *float32, n int) float32                    { panic("no AVX2") }
func dotF32AVX2(w, x *float32, n int) float32                             { panic("no AVX2") }

func axpyAVX2(y *float32, a float32, x *float32, n int) { panic("no AVX2") }

func deltaRuleAVX2(S, k, q, v, kv, o *float32, decay, beta float32, dk, dv int) { panic("no AVX2") }

func scoresAVX2(q, k *float32, stride, n, hd int, scale float32, out *float32) { panic("no AVX2") }
func scores3AVX2(q *float32, qStride int, k *float32, stride, n, hd int, scale float32, out *float32, outStride int) {
	panic("no AVX2")
}
func mixAVX2(o, v *float32, stride, n, hd int, p *float32)               { panic("no AVX2") }
func mixAccAVX2(o, v *float32, stride, n, hd int, p *float32)            { panic("no AVX2") }
func mixAcc2AVX2(o1, o2, v *float32, stride, n, hd int, p1, p2 *float32) { panic("no AVX2") }

func expSubAVX2(s *float32, n int, mx float32) float32 { panic("no AVX2") }

func quantizeRow8AVX2(x8 *int8, xs, x *float32, ng int) { panic("no AVX2") }
