//go:build arm64

package kernels

import "unsafe"

// vec_amd64.go's entry points on arm64: mulAdd, mulSet, add, scale and max
// in NEON (vec_arm64.s; n a multiple of 8, as on amd64), the 4-row f32 dot
// on the NEON dot, the rest Go loops with the assembly's arithmetic (see
// vec.go).

//go:noescape
func mulAddNEON(s, w, x *float32, n int)

//go:noescape
func mulSetNEON(s, w, x *float32, n int)

//go:noescape
func addNEON(y, x *float32, n int)

//go:noescape
func scaleNEON(x *float32, a float32, n int)

//go:noescape
func maxNEON(s *float32, n int) float32

func mulAddAVX2(s, w, x *float32, n int)     { mulAddNEON(s, w, x, n) }
func mulSetAVX2(s, w, x *float32, n int)     { mulSetNEON(s, w, x, n) }
func addAVX2(y, x *float32, n int)           { addNEON(y, x, n) }
func scaleAVX2(x *float32, a float32, n int) { scaleNEON(x, a, n) }
func maxAVX2(s *float32, n int) float32      { return maxNEON(s, n) }

func dotF32x4AVX2(w, x *float32, xstride, n int, out *float32, ostride int) {
	for k := 0; k < 4; k++ {
		*(*float32)(unsafe.Add(unsafe.Pointer(out), k*ostride)) =
			dotF32NEON(w, (*float32)(unsafe.Add(unsafe.Pointer(x), k*xstride)), n)
	}
}

func deltaRule32AVX2(S, k, q, v, kv, o *float32, decay, beta float32, dk, dv int) {
	deltaRuleAVX2(S, k, q, v, kv, o, decay, beta, dk, dv)
}

// readAVX2 is readBytes's entry point: the Go loop on arm64.
func readAVX2(p *byte, n int) uint64 { return readGo(unsafe.Slice(p, n*256)) }
