//go:build amd64

package kernels

import "golang.org/x/sys/cpu"

// hasHalfSIMD: VCVTPH2PS (F16C), present on every AVX2 processor so far.
var hasHalfSIMD = cpu.X86.HasF16C

// widenHalfSIMD widens n halves (n a positive multiple of 8) with VCVTPH2PS.
//
//go:noescape
func widenHalfSIMD(dst *float32, src *uint16, n int)
