//go:build amd64

package kernels

// mulAddAVX2 is MulAdd over n floats, n a multiple of 8.
//
//go:noescape
func mulAddAVX2(s, w, x *float32, n int)
