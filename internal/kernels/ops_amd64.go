//go:build amd64

package kernels

// The element-wise kernels of ops.go in ops_amd64.s. Each computes exactly
// the arithmetic of its Go twin (rmsNormGo, l2NormGo, siluGo, swigluGo,
// mulSigmoidGo, softmaxGo), so the two give the same bits; n ≥ 1, any
// length, tails masked.

//go:noescape
func rmsNormAVX2(dst, x, w *float32, n int, eps float32, zc bool)

//go:noescape
func l2NormAVX2(x *float32, n int, eps float32)

//go:noescape
func siluAVX2(x *float32, n int)

//go:noescape
func swigluAVX2(dst, gate, up *float32, n int)

//go:noescape
func mulSigmoidAVX2(o, gate *float32, n int)

//go:noescape
func softmaxAVX2(x *float32, n int)
