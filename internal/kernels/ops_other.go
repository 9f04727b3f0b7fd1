//go:build !amd64 && !arm64

package kernels

// Without the assembly useAVX2 is false and these are never called.

func rmsNormAVX2(dst, x, w *float32, n int, eps float32, zc bool) { panic("no AVX2") }
func l2NormAVX2(x *float32, n int, eps float32)                   { panic("no AVX2") }
func siluAVX2(x *float32, n int)                                  { panic("no AVX2") }
func swigluAVX2(dst, gate, up *float32, n int)                    { panic("no AVX2") }
func mulSigmoidAVX2(o, gate *float32, n int)                      { panic("no AVX2") }
func softmaxAVX2(x *float32, n int)                               { panic("no AVX2") }
