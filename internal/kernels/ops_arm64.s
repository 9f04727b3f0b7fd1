//go:build arm64

#include "textflag.h"
#include "neon_arm64.h"

// NEON versions of ops.go's element-wise kernels (and attend.go's expSub),
// each computing, lane by lane, exactly the arithmetic of its pure-Go
// twin, as ops_amd64.s does: separate FMUL and FADD (never fused), IEEE
// FDIV and FSQRT (never the FRECPE/FRSQRTE estimates), and sums in the
// lane structure the twin spells out. Chunks of 4 floats go through the
// vectors; the last 1-3 elements one at a time in lane 0 (FMOVS loads
// zero the other lanes, whose results are dropped), except in the sums,
// where a zero-padded partial vector adds +0 to lanes that are +0 or
// positive already. V8-V15 are left alone.

// Constants of Exp (attend.go) as the float32 bit patterns Go gives its
// untyped constants (the same table as ops_amd64.s).
DATA opsn<>+0(SB)/4, $0x3fb8aa3b  // log2(e)
DATA opsn<>+4(SB)/4, $0x3f000000  // 0.5
DATA opsn<>+8(SB)/4, $0x3f318000  // ln2 high part 0.693359375
DATA opsn<>+12(SB)/4, $0xb95e8083 // ln2 low part -2.12194440e-4
DATA opsn<>+16(SB)/4, $0x3ab60b61 // 1/720
DATA opsn<>+20(SB)/4, $0x3c088889 // 1/120
DATA opsn<>+24(SB)/4, $0x3d2aaaab // 1/24
DATA opsn<>+28(SB)/4, $0x3e2aaaab // 1/6
DATA opsn<>+32(SB)/4, $0x3f800000 // 1.0
DATA opsn<>+36(SB)/4, $0xc2ae999a // -87.3: below, Exp is 0
DATA opsn<>+40(SB)/4, $0x42b16666 // 88.7: above, Exp is +Inf
GLOBL opsn<>(SB), RODATA|NOPTR, $44

// EXPCONST broadcasts Exp's constants into V16-V26 in the table's order:
// V16 log2(e), V17 0.5, V18 ln2hi, V19 ln2lo, V20-V23 1/720, 1/120, 1/24,
// 1/6, V24 1.0, V25 -87.3, V26 88.7. Clobbers R9.
#define EXPCONST \
	MOVD $opsn<>(SB), R9 \
	VLD1R.P 4(R9), [V16.S4] \
	VLD1R.P 4(R9), [V17.S4] \
	VLD1R.P 4(R9), [V18.S4] \
	VLD1R.P 4(R9), [V19.S4] \
	VLD1R.P 4(R9), [V20.S4] \
	VLD1R.P 4(R9), [V21.S4] \
	VLD1R.P 4(R9), [V22.S4] \
	VLD1R.P 4(R9), [V23.S4] \
	VLD1R.P 4(R9), [V24.S4] \
	VLD1R.P 4(R9), [V25.S4] \
	VLD1R.P 4(R9), [V26.S4]

// EXP sets V(p) = Exp(V(x)) per lane, step for step as the scalar Exp:
// lanes below -87.3 give +0 (V(m) marks them; FCMGT is false for NaN, so
// NaN is kept), the argument is clamped to [-87.3, 88.7] (FMAX and FMIN
// pass NaN on; at 88.7 k is 128 and 2^k is +Inf, Exp's answer above
// 88.7), k = floor(x·log2e + 0.5), r = x - k·ln2hi - k·ln2lo, Horner's
// degree-6 polynomial, times 2^k built as (int(k)<<23) + bits(1.0). V(x)
// is clobbered (it ends as r); V(k), V(m), V(t) are scratch.
#define EXP(x, k, m, p, t) \
	FCMGT4(m, 25, x) \
	FMAX4(x, x, 25) \
	FMIN4(x, x, 26) \
	FMUL4(k, x, 16) \
	FADD4(k, k, 17) \
	FRINTM4(k, k) \
	FMUL4(t, k, 18) \
	FSUB4(x, x, t) \
	FMUL4(t, k, 19) \
	FSUB4(x, x, t) \
	FMUL4(p, 20, x) \
	FADD4(p, p, 21) \
	FMUL4(p, p, x) \
	FADD4(p, p, 22) \
	FMUL4(p, p, x) \
	FADD4(p, p, 23) \
	FMUL4(p, p, x) \
	FADD4(p, p, 17) \
	FMUL4(p, p, x) \
	FADD4(p, p, 24) \
	FMUL4(p, p, x) \
	FADD4(p, p, 24) \
	FCVTZS4(k, k) \
	SHL4(k, k, 23) \
	ADDI4(k, k, 24) \
	FMUL4(p, p, k) \
	BIC16(p, p, m)

// SIGMOID sets V(p) = 1/(1+Exp(-V(g))) per lane, as the scalar Sigmoid.
// V(g) is kept.
#define SIGMOID(g, x, k, m, p, t) \
	FNEG4(x, g) \
	EXP(x, k, m, p, t) \
	FADD4(p, p, 24) \
	FDIV4(p, 24, p)

// SUMSQ sets F0 = Σx² for the R5 floats at R4 in sumSquares' lane
// structure: 32-float blocks into V0-V7 (element i into lane i%32), the
// rest into V0, V1 (rest element j into lane j%8: chunks of 4 alternate,
// a last partial chunk zero-padded), then lanes l, l+8, l+16, l+24 as
// (a+b)+(c+d) and hsum8's order. Clobbers R4-R7, V0-V7, V28-V31.
#define SUMSQ \
	VEOR V0.B16, V0.B16, V0.B16 \
	VEOR V1.B16, V1.B16, V1.B16 \
	VEOR V2.B16, V2.B16, V2.B16 \
	VEOR V3.B16, V3.B16, V3.B16 \
	VEOR V4.B16, V4.B16, V4.B16 \
	VEOR V5.B16, V5.B16, V5.B16 \
	VEOR V6.B16, V6.B16, V6.B16 \
	VEOR V7.B16, V7.B16, V7.B16 \
	LSR $5, R5, R6 \
	CBZ R6, ssrest \
ss32: \
	VLD1.P 64(R4), [V28.S4, V29.S4, V30.S4, V31.S4] \
	FMUL4(28, 28, 28) \
	FMUL4(29, 29, 29) \
	FMUL4(30, 30, 30) \
	FMUL4(31, 31, 31) \
	FADD4(0, 0, 28) \
	FADD4(1, 1, 29) \
	FADD4(2, 2, 30) \
	FADD4(3, 3, 31) \
	VLD1.P 64(R4), [V28.S4, V29.S4, V30.S4, V31.S4] \
	FMUL4(28, 28, 28) \
	FMUL4(29, 29, 29) \
	FMUL4(30, 30, 30) \
	FMUL4(31, 31, 31) \
	FADD4(4, 4, 28) \
	FADD4(5, 5, 29) \
	FADD4(6, 6, 30) \
	FADD4(7, 7, 31) \
	SUBS $1, R6, R6 \
	BNE ss32 \
ssrest: \
	AND $31, R5, R6 \
	LSR $3, R6, R7 \
	CBZ R7, ss4 \
ss8: \
	VLD1.P 32(R4), [V28.S4, V29.S4] \
	FMUL4(28, 28, 28) \
	FMUL4(29, 29, 29) \
	FADD4(0, 0, 28) \
	FADD4(1, 1, 29) \
	SUBS $1, R7, R7 \
	BNE ss8 \
ss4: \
	TBZ $2, R6, sspart \
	VLD1.P 16(R4), [V28.S4] \
	FMUL4(28, 28, 28) \
	FADD4(0, 0, 28) \
sspart: \
	AND $3, R6, R7 \
	CBZ R7, ssred \
	FMOVS (R4), F28 \
	CMP $2, R7 \
	BLT sssq \
	ADD $4, R4, R4 \
	VLD1.P 4(R4), V28.S[1] \
	CMP $3, R7 \
	BLT sssq \
	VLD1 (R4), V28.S[2] \
sssq: \
	FMUL4(28, 28, 28) \
	TBNZ $2, R6, sshi \
	FADD4(0, 0, 28) \
	B ssred \
sshi: \
	FADD4(1, 1, 28) \
ssred: \
	FADD4(0, 0, 2) \
	FADD4(4, 4, 6) \
	FADD4(0, 0, 4) \
	FADD4(1, 1, 3) \
	FADD4(5, 5, 7) \
	FADD4(1, 1, 5) \
	FADD4(0, 0, 1) \
	FADDP4(0, 0, 0) \
	FADDP2S(0, 0)

// INVSQRT sets F0 = float32(1/sqrt(float64(F0))), the norms' scale, in
// double precision as math.Sqrt computes it. Clobbers F1.
#define INVSQRT \
	FCVTSD F0, F0 \
	FSQRTD F0, F0 \
	FMOVD $1.0, F1 \
	FDIVD F0, F1, F0 \
	FCVTDS F0, F0

// func rmsNormNEON(dst, x, w *float32, n int, eps float32, zc bool)
// dst = (x·inv)·w, or (x·inv)·(1+w) with zc, inv = 1/sqrt(Σx²/n + eps),
// n ≥ 1. dst may equal x: the sum reads all of x first, and each chunk is
// loaded before it is stored.
TEXT ·rmsNormNEON(SB), NOSPLIT, $0-37
	MOVD dst+0(FP), R0
	MOVD x+8(FP), R1
	MOVD w+16(FP), R2
	MOVD n+24(FP), R3
	MOVD R1, R4
	MOVD R3, R5
	SUMSQ
	SCVTFS R3, F1
	FDIVS F1, F0, F0 // Σx²/n
	FMOVS eps+32(FP), F1
	FADDS F1, F0, F0
	INVSQRT
	VDUP V0.S[0], V31.S4 // inv
	FMOVS $1.0, F30
	VDUP V30.S[0], V30.S4
	MOVBU zc+36(FP), R6
	LSR $2, R3, R7
	AND $3, R3, R8
	CBNZ R6, rnzc
	CBZ R7, rntail
rnloop:
	VLD1.P 16(R1), [V16.S4]
	VLD1.P 16(R2), [V17.S4]
	FMUL4(16, 16, 31)
	FMUL4(16, 16, 17)
	VST1.P [V16.S4], 16(R0)
	SUBS $1, R7, R7
	BNE rnloop
rntail:
	CBZ R8, rndone
rntl:
	FMOVS.P 4(R1), F16
	FMOVS.P 4(R2), F17
	FMULS F0, F16, F16
	FMULS F17, F16, F16
	FMOVS.P F16, 4(R0)
	SUBS $1, R8, R8
	BNE rntl
	RET
rnzc:
	CBZ R7, rnzctail
rnzcloop:
	VLD1.P 16(R1), [V16.S4]
	VLD1.P 16(R2), [V17.S4]
	FMUL4(16, 16, 31)
	FADD4(17, 30, 17) // 1+w
	FMUL4(16, 16, 17)
	VST1.P [V16.S4], 16(R0)
	SUBS $1, R7, R7
	BNE rnzcloop
rnzctail:
	CBZ R8, rndone
rnzctl:
	FMOVS.P 4(R1), F16
	FMOVS.P 4(R2), F17
	FMULS F0, F16, F16
	FADDS F17, F30, F17
	FMULS F17, F16, F16
	FMOVS.P F16, 4(R0)
	SUBS $1, R8, R8
	BNE rnzctl
rndone:
	RET

// func l2NormNEON(x *float32, n int, eps float32)
// x *= 1/sqrt(Σx² + eps), the sum as in RMSNorm; n ≥ 1.
TEXT ·l2NormNEON(SB), NOSPLIT, $0-20
	MOVD x+0(FP), R0
	MOVD n+8(FP), R3
	MOVD R0, R4
	MOVD R3, R5
	SUMSQ
	FMOVS eps+16(FP), F1
	FADDS F1, F0, F0
	INVSQRT
	VDUP V0.S[0], V31.S4
	LSR $2, R3, R7
	AND $3, R3, R8
	CBZ R7, l2tail
l2loop:
	VLD1 (R0), [V16.S4]
	FMUL4(16, 16, 31)
	VST1.P [V16.S4], 16(R0)
	SUBS $1, R7, R7
	BNE l2loop
l2tail:
	CBZ R8, l2done
l2tl:
	FMOVS (R0), F16
	FMULS F0, F16, F16
	FMOVS.P F16, 4(R0)
	SUBS $1, R8, R8
	BNE l2tl
l2done:
	RET

// func siluNEON(x *float32, n int)
// x = x·Sigmoid(x).
TEXT ·siluNEON(SB), NOSPLIT, $0-16
	MOVD x+0(FP), R0
	MOVD n+8(FP), R3
	EXPCONST
	LSR $2, R3, R7
	AND $3, R3, R8
	CBZ R7, situl
siloop:
	VLD1 (R0), [V0.S4]
	SIGMOID(0, 1, 2, 3, 4, 5)
	FMUL4(4, 0, 4)
	VST1.P [V4.S4], 16(R0)
	SUBS $1, R7, R7
	BNE siloop
situl:
	CBZ R8, sidone
sitl:
	FMOVS (R0), F0
	SIGMOID(0, 1, 2, 3, 4, 5)
	FMUL4(4, 0, 4)
	FMOVS.P F4, 4(R0)
	SUBS $1, R8, R8
	BNE sitl
sidone:
	RET

// func swigluNEON(dst, gate, up *float32, n int)
// dst = (gate·Sigmoid(gate))·up; dst may equal gate or up.
TEXT ·swigluNEON(SB), NOSPLIT, $0-32
	MOVD dst+0(FP), R0
	MOVD gate+8(FP), R1
	MOVD up+16(FP), R2
	MOVD n+24(FP), R3
	EXPCONST
	LSR $2, R3, R7
	AND $3, R3, R8
	CBZ R7, swtail
swloop:
	VLD1.P 16(R1), [V0.S4]
	VLD1.P 16(R2), [V6.S4]
	SIGMOID(0, 1, 2, 3, 4, 5)
	FMUL4(4, 0, 4)
	FMUL4(4, 4, 6)
	VST1.P [V4.S4], 16(R0)
	SUBS $1, R7, R7
	BNE swloop
swtail:
	CBZ R8, swdone
swtl:
	FMOVS.P 4(R1), F0
	FMOVS.P 4(R2), F6
	SIGMOID(0, 1, 2, 3, 4, 5)
	FMUL4(4, 0, 4)
	FMUL4(4, 4, 6)
	FMOVS.P F4, 4(R0)
	SUBS $1, R8, R8
	BNE swtl
swdone:
	RET

// func mulSigmoidNEON(o, gate *float32, n int)
// o = o·Sigmoid(gate).
TEXT ·mulSigmoidNEON(SB), NOSPLIT, $0-24
	MOVD o+0(FP), R0
	MOVD gate+8(FP), R1
	MOVD n+16(FP), R3
	EXPCONST
	LSR $2, R3, R7
	AND $3, R3, R8
	CBZ R7, mstail
msloop:
	VLD1.P 16(R1), [V0.S4]
	VLD1 (R0), [V6.S4]
	SIGMOID(0, 1, 2, 3, 4, 5)
	FMUL4(4, 6, 4)
	VST1.P [V4.S4], 16(R0)
	SUBS $1, R7, R7
	BNE msloop
mstail:
	CBZ R8, msdone
mstl:
	FMOVS.P 4(R1), F0
	FMOVS (R0), F6
	SIGMOID(0, 1, 2, 3, 4, 5)
	FMUL4(4, 6, 4)
	FMOVS.P F4, 4(R0)
	SUBS $1, R8, R8
	BNE mstl
msdone:
	RET

// EXPSUM8 replaces the R7·8 floats at R0 with Exp(x - m), m broadcast in
// V28, adding them into V0 (elements 0-3 of each 8) and V1 (4-7): the
// lanes of expSubGo and softmaxGo's sums (element i into lane i%8).
#define EXPSUM8 \
es8: \
	VLD1 (R0), [V2.S4, V3.S4] \
	FSUB4(2, 2, 28) \
	FSUB4(3, 3, 28) \
	EXP(2, 4, 5, 6, 7) \
	EXP(3, 4, 5, 7, 27) \
	VST1.P [V6.S4, V7.S4], 32(R0) \
	FADD4(0, 0, 6) \
	FADD4(1, 1, 7) \
	SUBS $1, R7, R7 \
	BNE es8

// func expSubNEON(s *float32, n int, mx float32) float32
// expSubGo for n a multiple of 8: s = Exp(s - mx), returning the sum in 8
// lanes reduced in hsum8's order.
TEXT ·expSubNEON(SB), NOSPLIT, $0-28
	MOVD s+0(FP), R0
	MOVD n+8(FP), R3
	FMOVS mx+16(FP), F28
	VDUP V28.S[0], V28.S4
	EXPCONST
	VEOR V0.B16, V0.B16, V0.B16
	VEOR V1.B16, V1.B16, V1.B16
	LSR $3, R3, R7
	CBZ R7, esdone
	EXPSUM8
esdone:
	FADD4(0, 0, 1)
	FADDP4(0, 0, 0)
	FADDP2S(0, 0)
	FMOVS F0, ret+24(FP)
	RET

// func softmaxNEON(x *float32, n int)
// Three passes as softmaxGo, n ≥ 1: the maximum m (exact in any order;
// FMAX is Go's max), e = Exp(x-m) stored back and summed in 8 lanes
// (element i into lane i%8, the last partial chunk reloaded zero-padded),
// then x *= 1/hsum8.
TEXT ·softmaxNEON(SB), NOSPLIT, $0-16
	MOVD x+0(FP), R1
	MOVD n+8(FP), R3
	MOVD R1, R0
	VLD1R (R0), [V28.S4]
	LSR $2, R3, R7
	CBZ R7, smmaxred
smmax:
	VLD1.P 16(R0), [V2.S4]
	FMAX4(28, 28, 2)
	SUBS $1, R7, R7
	BNE smmax
smmaxred:
	FMAXV4(28, 28)
	AND $3, R3, R8
	CBZ R8, smmaxdone
smmaxtl:
	FMOVS.P 4(R0), F2
	FMAXS F2, F28, F28
	SUBS $1, R8, R8
	BNE smmaxtl
smmaxdone:
	VDUP V28.S[0], V28.S4 // m
	EXPCONST
	VEOR V0.B16, V0.B16, V0.B16
	VEOR V1.B16, V1.B16, V1.B16
	MOVD R1, R0
	LSR $3, R3, R7
	CBZ R7, smexp4
	EXPSUM8
smexp4:
	TBZ $2, R3, smexppart
	VLD1 (R0), [V2.S4]
	FSUB4(2, 2, 28)
	EXP(2, 4, 5, 6, 7)
	VST1.P [V6.S4], 16(R0)
	FADD4(0, 0, 6)
smexppart:
	AND $3, R3, R8
	CBZ R8, smsum
	MOVD R0, R4
	MOVD R8, R7
smexptl:
	FMOVS (R0), F2
	FSUB4(2, 2, 28)
	EXP(2, 4, 5, 6, 7)
	FMOVS.P F6, 4(R0)
	SUBS $1, R7, R7
	BNE smexptl
	FMOVS (R4), F2 // the partial chunk's values, zero-padded
	CMP $2, R8
	BLT smpartadd
	ADD $4, R4, R4
	VLD1.P 4(R4), V2.S[1]
	CMP $3, R8
	BLT smpartadd
	VLD1 (R4), V2.S[2]
smpartadd:
	TBNZ $2, R3, smparthi
	FADD4(0, 0, 2)
	B smsum
smparthi:
	FADD4(1, 1, 2)
smsum:
	FADD4(0, 0, 1)
	FADDP4(0, 0, 0)
	FADDP2S(0, 0)
	FMOVS $1.0, F29
	FDIVS F0, F29, F29 // 1/Σe
	VDUP V29.S[0], V30.S4
	MOVD R1, R0
	LSR $2, R3, R7
	CBZ R7, smscaletail
smscale:
	VLD1 (R0), [V2.S4]
	FMUL4(2, 2, 30)
	VST1.P [V2.S4], 16(R0)
	SUBS $1, R7, R7
	BNE smscale
smscaletail:
	AND $3, R3, R8
	CBZ R8, smdone
smscaletl:
	FMOVS (R0), F2
	FMULS F29, F2, F2
	FMOVS.P F2, 4(R0)
	SUBS $1, R8, R8
	BNE smscaletl
smdone:
	RET
