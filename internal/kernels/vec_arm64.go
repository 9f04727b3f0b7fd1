//go:build arm64

package kernels

import "unsafe"

// vec_amd64.go's entry points on arm64: the 4-row f32 dot on the NEON dot,
// the rest Go loops with the assembly's arithmetic (see vec.go).

func mulAddAVX2(s, w, x *float32, n int) {
	ss, ws, xs := f32s2(s, n), f32s2(w, n), f32s2(x, n)
	for i := range ss {
		ss[i] += float32(ws[i] * xs[i])
	}
}

func maxAVX2(s *float32, n int) float32 {
	x := f32s2(s, n)
	m := x[0]
	for _, v := range x {
		m = max(m, v)
	}
	return m
}

func scaleAVX2(x *float32, a float32, n int) {
	xs := f32s2(x, n)
	for i := range xs {
		xs[i] *= a
	}
}

func dotF32x4AVX2(w, x *float32, xstride, n int, out *float32, ostride int) {
	for k := 0; k < 4; k++ {
		*(*float32)(unsafe.Add(unsafe.Pointer(out), k*ostride)) =
			dotF32NEON(w, (*float32)(unsafe.Add(unsafe.Pointer(x), k*xstride)), n)
	}
}

func mulSetAVX2(s, w, x *float32, n int) {
	ss, ws, xs := f32s2(s, n), f32s2(w, n), f32s2(x, n)
	for i := range ss {
		var z float32
		ss[i] = z + float32(ws[i]*xs[i])
	}
}

func addAVX2(y, x *float32, n int) {
	ys, xs := f32s2(y, n), f32s2(x, n)
	for i := range ys {
		ys[i] += xs[i]
	}
}

func deltaRule32AVX2(S, k, q, v, kv, o *float32, decay, beta float32, dk, dv int) {
	deltaRuleAVX2(S, k, q, v, kv, o, decay, beta, dk, dv)
}

// readAVX2 is readBytes's entry point: the Go loop on arm64.
func readAVX2(p *byte, n int) uint64 { return readGo(unsafe.Slice(p, n*256)) }
