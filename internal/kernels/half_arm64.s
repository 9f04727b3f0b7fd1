//go:build arm64

#include "textflag.h"
#include "neon_arm64.h"

// func widenHalfSIMD(dst *float32, src *uint16, n int)
// Eight halves at a time, n a positive multiple of 8. FCVTL widens
// exactly, as quant.F16ToF32 does.
TEXT ·widenHalfSIMD(SB), NOSPLIT, $0-24
	MOVD dst+0(FP), R0
	MOVD src+8(FP), R1
	MOVD n+16(FP), R2
	LSR $3, R2
	CBZ R2, done
loop:
	VLD1.P 16(R1), [V0.H8]
	FCVTL4(1, 0)
	FCVTL24(2, 0)
	VST1.P [V1.S4, V2.S4], 32(R0)
	SUB $1, R2
	CBNZ R2, loop
done:
	RET
