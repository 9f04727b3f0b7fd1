//go:build arm64

package kernels

// vec_amd64.go's entry points on arm64, all NEON (vec_arm64.s): mulAdd,
// mulSet, add, scale and max (n a multiple of 8, as on amd64), the 4-row
// f32 dot, the 32-column delta-rule step (the general one) and the
// bandwidth reader.

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

//go:noescape
func dotF32x4NEON(w, x *float32, xstride, n int, out *float32, ostride int)

//go:noescape
func readNEON(p *byte, n int) uint64

func dotF32x4AVX2(w, x *float32, xstride, n int, out *float32, ostride int) {
	dotF32x4NEON(w, x, xstride, n, out, ostride)
}

func deltaRule32AVX2(S, k, q, v, kv, o *float32, decay, beta float32, dk, dv int, pf *float32, pfstep int) {
	deltaRuleAVX2(S, k, q, v, kv, o, decay, beta, dk, dv)
}

// readAVX2 is readBytes's entry point.
func readAVX2(p *byte, n int) uint64 { return readNEON(p, n) }

// readAVX2x4 reads its four regions one after another here: whether
// streams read together go faster on arm64 has not been measured.
func readAVX2x4(p, q, r, s *byte, n int) uint64 {
	return readNEON(p, n) + readNEON(q, n) + readNEON(r, n) + readNEON(s, n)
}
