//go:build amd64

package kernels

// mulAddAVX2 is MulAdd over n floats, n a multiple of 8.
//
//go:noescape
func mulAddAVX2(s, w, x *float32, n int)

// maxAVX2 is the largest of n floats, n a positive multiple of 8.
//
//go:noescape
func maxAVX2(s *float32, n int) float32

// scaleAVX2 is x *= a over n floats, n a multiple of 8.
//
//go:noescape
func scaleAVX2(x *float32, a float32, n int)

// dotF32x4AVX2 is dotF32AVX2 of one weight row against four activation rows
// xstride bytes apart, writing out[k·ostride bytes]; n a multiple of 16.
//
//go:noescape
func dotF32x4AVX2(w, x *float32, xstride, n int, out *float32, ostride int)

// mulSetAVX2 is MulSet over n floats, n a multiple of 8.
//
//go:noescape
func mulSetAVX2(s, w, x *float32, n int)

// addAVX2 is y += x over n floats, n a multiple of 8.
//
//go:noescape
func addAVX2(y, x *float32, n int)

// deltaRule32AVX2 is deltaRuleAVX2 for dv a multiple of 32, with identical
// results.
//
//go:noescape
func deltaRule32AVX2(S, k, q, v, kv, o *float32, decay, beta float32, dk, dv int, pf *float32, pfstep int)

// readAVX2 sums n blocks of 256 bytes as uint64 lanes (ReadBandwidth).
//
//go:noescape
func readAVX2(p *byte, n int) uint64

// readAVX2x4 is readAVX2 over n blocks at each of p, q, r and s, read
// together.
//
//go:noescape
func readAVX2x4(p, q, r, s *byte, n int) uint64
