//go:build !amd64 && !arm64

package kernels

func mulAddAVX2(s, w, x *float32, n int) { panic("unreachable") }

func maxAVX2(s *float32, n int) float32      { panic("unreachable") }
func scaleAVX2(x *float32, a float32, n int) { panic("unreachable") }

func dotF32x4AVX2(w, x *float32, xstride, n int, out *float32, ostride int) { panic("unreachable") }

func mulSetAVX2(s, w, x *float32, n int) { panic("unreachable") }
func addAVX2(y, x *float32, n int)       { panic("unreachable") }

func deltaRule32AVX2(S, k, q, v, kv, o *float32, decay, beta float32, dk, dv int, pf *float32, pfstep int) {
	panic("unreachable")
}

func readAVX2(p *byte, n int) uint64 { panic("unreachable") }

func readAVX2x4(p, q, r, s *byte, n int) uint64 { panic("unreachable") }
