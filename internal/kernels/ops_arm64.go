//go:build arm64

package kernels

// ops_amd64.go's entry points on arm64: NEON (ops_arm64.s) computing the Go
// twins' arithmetic (ops.go), n ≥ 1.

//go:noescape
func rmsNormNEON(dst, x, w *float32, n int, eps float32, zc bool)

//go:noescape
func l2NormNEON(x *float32, n int, eps float32)

//go:noescape
func siluNEON(x *float32, n int)

//go:noescape
func swigluNEON(dst, gate, up *float32, n int)

//go:noescape
func mulSigmoidNEON(o, gate *float32, n int)

//go:noescape
func softmaxNEON(x *float32, n int)

//go:noescape
func expSubNEON(s *float32, n int, mx float32) float32

func rmsNormAVX2(dst, x, w *float32, n int, eps float32, zc bool) {
	rmsNormNEON(dst, x, w, n, eps, zc)
}
func l2NormAVX2(x *float32, n int, eps float32) { l2NormNEON(x, n, eps) }
func siluAVX2(x *float32, n int)                { siluNEON(x, n) }
func swigluAVX2(dst, gate, up *float32, n int)  { swigluNEON(dst, gate, up, n) }
func mulSigmoidAVX2(o, gate *float32, n int)    { mulSigmoidNEON(o, gate, n) }
func softmaxAVX2(x *float32, n int)             { softmaxNEON(x, n) }
