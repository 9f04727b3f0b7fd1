//go:build !amd64 && !arm64

package kernels

const hasHalfSIMD = false

func widenHalfSIMD(dst *float32, src *uint16, n int) { panic("unreachable") }
