//go:build amd64

#include "textflag.h"

// func widenHalfSIMD(dst *float32, src *uint16, n int)
// Eight halves at a time, n a positive multiple of 8. VCVTPH2PS widens
// exactly, as quant.F16ToF32 does.
TEXT ·widenHalfSIMD(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $3, CX
	JEQ done
loop:
	VCVTPH2PS (SI), Y0
	VMOVUPS Y0, (DI)
	ADDQ $16, SI
	ADDQ $32, DI
	DECQ CX
	JNE loop
	VZEROUPPER
done:
	RET
