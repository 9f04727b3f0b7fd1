//go:build arm64

package kernels

// hasHalfSIMD: FCVTL is part of the base NEON instruction set.
const hasHalfSIMD = true

// widenHalfSIMD widens n halves (n a positive multiple of 8) with FCVTL.
//
//go:noescape
func widenHalfSIMD(dst *float32, src *uint16, n int)
