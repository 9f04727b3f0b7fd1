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
