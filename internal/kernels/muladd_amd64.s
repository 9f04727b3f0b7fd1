//go:build amd64

#include "textflag.h"

// func mulAddAVX2(s, w, x *float32, n int)
// s += w·x with VMULPS then VADDPS (the product rounded first, as Go
// computes s += w*x); n a multiple of 8.
TEXT ·mulAddAVX2(SB), NOSPLIT, $0-32
	MOVQ s+0(FP), DI
	MOVQ w+8(FP), SI
	MOVQ x+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $3, CX
	JEQ done
loop:
	VMOVUPS (SI), Y0
	VMULPS (DX), Y0, Y0
	VADDPS (DI), Y0, Y0
	VMOVUPS Y0, (DI)
	ADDQ $32, SI
	ADDQ $32, DX
	ADDQ $32, DI
	DECQ CX
	JNE loop
	VZEROUPPER
done:
	RET
