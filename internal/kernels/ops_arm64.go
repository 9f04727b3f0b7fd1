//go:build arm64

package kernels

// ops_amd64.go's entry points on arm64: the Go twins (ops.go), n ≥ 1.

func rmsNormAVX2(dst, x, w *float32, n int, eps float32, zc bool) {
	rmsNormGo(f32s2(dst, n), f32s2(x, n), f32s2(w, n), eps, zc)
}
func l2NormAVX2(x *float32, n int, eps float32) { l2NormGo(f32s2(x, n), eps) }
func siluAVX2(x *float32, n int)                { siluGo(f32s2(x, n)) }
func swigluAVX2(dst, gate, up *float32, n int)  { swigluGo(f32s2(dst, n), f32s2(gate, n), f32s2(up, n)) }
func mulSigmoidAVX2(o, gate *float32, n int)    { mulSigmoidGo(f32s2(o, n), f32s2(gate, n)) }
func softmaxAVX2(x *float32, n int)             { softmaxGo(f32s2(x, n)) }
