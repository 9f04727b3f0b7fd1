//go:build arm64

#include "textflag.h"
#include "neon_arm64.h"

// NEON loops of vec.go's kernels, for n a multiple of 8 (the callers do
// the rest in Go), each lane computing its Go loop's arithmetic: the
// product rounded (FMUL) before the sum (FADD), never fused.

// func mulAddNEON(s, w, x *float32, n int)
// s[i] += float32(w[i]·x[i]).
TEXT ·mulAddNEON(SB), NOSPLIT, $0-32
	MOVD s+0(FP), R0
	MOVD w+8(FP), R1
	MOVD x+16(FP), R2
	MOVD n+24(FP), R3
	LSR $3, R3, R3
	CBZ R3, madone
maloop:
	VLD1 (R0), [V0.S4, V1.S4]
	VLD1.P 32(R1), [V2.S4, V3.S4]
	VLD1.P 32(R2), [V4.S4, V5.S4]
	FMUL4(2, 2, 4)
	FMUL4(3, 3, 5)
	FADD4(0, 0, 2)
	FADD4(1, 1, 3)
	VST1.P [V0.S4, V1.S4], 32(R0)
	SUBS $1, R3, R3
	BNE maloop
madone:
	RET

// func mulSetNEON(s, w, x *float32, n int)
// s[i] = 0 + float32(w[i]·x[i]): a -0 product becomes +0, as in MulSet.
TEXT ·mulSetNEON(SB), NOSPLIT, $0-32
	MOVD s+0(FP), R0
	MOVD w+8(FP), R1
	MOVD x+16(FP), R2
	MOVD n+24(FP), R3
	VEOR V6.B16, V6.B16, V6.B16
	LSR $3, R3, R3
	CBZ R3, msdone
msloop:
	VLD1.P 32(R1), [V2.S4, V3.S4]
	VLD1.P 32(R2), [V4.S4, V5.S4]
	FMUL4(2, 2, 4)
	FMUL4(3, 3, 5)
	FADD4(0, 6, 2)
	FADD4(1, 6, 3)
	VST1.P [V0.S4, V1.S4], 32(R0)
	SUBS $1, R3, R3
	BNE msloop
msdone:
	RET

// func addNEON(y, x *float32, n int)
// y[i] += x[i].
TEXT ·addNEON(SB), NOSPLIT, $0-24
	MOVD y+0(FP), R0
	MOVD x+8(FP), R1
	MOVD n+16(FP), R3
	LSR $3, R3, R3
	CBZ R3, addone
adloop:
	VLD1 (R0), [V0.S4, V1.S4]
	VLD1.P 32(R1), [V2.S4, V3.S4]
	FADD4(0, 0, 2)
	FADD4(1, 1, 3)
	VST1.P [V0.S4, V1.S4], 32(R0)
	SUBS $1, R3, R3
	BNE adloop
addone:
	RET

// func scaleNEON(x *float32, a float32, n int)
// x[i] *= a.
TEXT ·scaleNEON(SB), NOSPLIT, $0-24
	MOVD x+0(FP), R0
	FMOVS a+8(FP), F7
	VDUP V7.S[0], V7.S4
	MOVD n+16(FP), R3
	LSR $3, R3, R3
	CBZ R3, scdone
scloop:
	VLD1 (R0), [V0.S4, V1.S4]
	FMUL4(0, 0, 7)
	FMUL4(1, 1, 7)
	VST1.P [V0.S4, V1.S4], 32(R0)
	SUBS $1, R3, R3
	BNE scloop
scdone:
	RET

// func maxNEON(s *float32, n int) float32
// The largest of s[0..n), n ≥ 8. FMAX is Go's max: NaN if either operand
// is NaN, +0 over -0; the maximum is exact, so the order is free.
TEXT ·maxNEON(SB), NOSPLIT, $0-20
	MOVD s+0(FP), R0
	MOVD n+8(FP), R3
	LSR $3, R3, R3
	VLD1.P 32(R0), [V0.S4, V1.S4]
	SUBS $1, R3, R3
	BEQ mxred
mxloop:
	VLD1.P 32(R0), [V2.S4, V3.S4]
	FMAX4(0, 0, 2)
	FMAX4(1, 1, 3)
	SUBS $1, R3, R3
	BNE mxloop
mxred:
	FMAX4(0, 0, 1)
	FMAXV4(0, 0)
	FMOVS F0, ret+16(FP)
	RET
