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

// func maxAVX2(s *float32, n int) float32
// The largest of n floats, n a positive multiple of 8 (max is exact, so the
// lane order does not matter).
TEXT ·maxAVX2(SB), NOSPLIT, $0-20
	MOVQ s+0(FP), SI
	MOVQ n+8(FP), CX
	SHRQ $3, CX
	VMOVUPS (SI), Y0
	ADDQ $32, SI
	DECQ CX
	JEQ mreduce
mloop:
	VMAXPS (SI), Y0, Y0
	ADDQ $32, SI
	DECQ CX
	JNE mloop
mreduce:
	VEXTRACTF128 $1, Y0, X1
	VMAXPS X1, X0, X0
	VPERMILPS $0x4e, X0, X1
	VMAXPS X1, X0, X0
	VPERMILPS $0xb1, X0, X1
	VMAXPS X1, X0, X0
	VZEROUPPER
	MOVSS X0, ret+16(FP)
	RET

// func scaleAVX2(x *float32, a float32, n int)
// x *= a for n a multiple of 8.
TEXT ·scaleAVX2(SB), NOSPLIT, $0-24
	MOVQ x+0(FP), DI
	VBROADCASTSS a+8(FP), Y1
	MOVQ n+16(FP), CX
	SHRQ $3, CX
	JEQ sdone
sloop:
	VMULPS (DI), Y1, Y0
	VMOVUPS Y0, (DI)
	ADDQ $32, DI
	DECQ CX
	JNE sloop
	VZEROUPPER
sdone:
	RET
