package kernels

import "os"

func init() {
	// SLUICE_NOSIMD=1 selects the pure-Go kernels, for comparison and for
	// bisecting a numerical difference.
	if os.Getenv("SLUICE_NOSIMD") != "" {
		useAVX2 = false
	}
}

// SIMD reports whether the assembly kernels are in use.
func SIMD() bool { return useAVX2 }
