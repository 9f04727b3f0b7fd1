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

// SUMROW reduces the 16 lanes of one dot product, V(a)..V(a+3) (lanes
// 0-3, 4-7, 8-11, 12-15), into S(a) in sum16's order, as dot_arm64.s's
// SUM16 does for V0-V3.
#define SUMROW(a, b, c, d) \
	FADD4(a, a, c) \
	FADD4(b, b, d) \
	FADD4(a, a, b) \
	FADDP4(a, a, a) \
	FADDP2S(a, a)

// func dotF32x4NEON(w, x *float32, xstride, n int, out *float32, ostride int)
// dotF32NEON of one weight row against four activation rows xstride bytes
// apart, each result out + k·ostride bytes, n a multiple of 16: each row's
// sum is dotF32's (element i fused into lane i%16 in index order, then
// sum16), the weights loaded once for the four. Accumulators V0-V3,
// V4-V7, V16-V19, V20-V23; weights V24-V27; activations V28-V31.
TEXT ·dotF32x4NEON(SB), NOSPLIT, $0-48
	MOVD w+0(FP), R0
	MOVD x+8(FP), R1
	MOVD xstride+16(FP), R5
	ADD R5, R1, R2
	ADD R5, R2, R3
	ADD R5, R3, R4
	MOVD n+24(FP), R6
	VEOR V0.B16, V0.B16, V0.B16
	VEOR V1.B16, V1.B16, V1.B16
	VEOR V2.B16, V2.B16, V2.B16
	VEOR V3.B16, V3.B16, V3.B16
	VEOR V4.B16, V4.B16, V4.B16
	VEOR V5.B16, V5.B16, V5.B16
	VEOR V6.B16, V6.B16, V6.B16
	VEOR V7.B16, V7.B16, V7.B16
	VEOR V16.B16, V16.B16, V16.B16
	VEOR V17.B16, V17.B16, V17.B16
	VEOR V18.B16, V18.B16, V18.B16
	VEOR V19.B16, V19.B16, V19.B16
	VEOR V20.B16, V20.B16, V20.B16
	VEOR V21.B16, V21.B16, V21.B16
	VEOR V22.B16, V22.B16, V22.B16
	VEOR V23.B16, V23.B16, V23.B16
	LSR $4, R6, R6
	CBZ R6, d4done
d4loop:
	VLD1.P 64(R0), [V24.S4, V25.S4, V26.S4, V27.S4]
	VLD1.P 64(R1), [V28.S4, V29.S4, V30.S4, V31.S4]
	VFMLA V28.S4, V24.S4, V0.S4
	VFMLA V29.S4, V25.S4, V1.S4
	VFMLA V30.S4, V26.S4, V2.S4
	VFMLA V31.S4, V27.S4, V3.S4
	VLD1.P 64(R2), [V28.S4, V29.S4, V30.S4, V31.S4]
	VFMLA V28.S4, V24.S4, V4.S4
	VFMLA V29.S4, V25.S4, V5.S4
	VFMLA V30.S4, V26.S4, V6.S4
	VFMLA V31.S4, V27.S4, V7.S4
	VLD1.P 64(R3), [V28.S4, V29.S4, V30.S4, V31.S4]
	VFMLA V28.S4, V24.S4, V16.S4
	VFMLA V29.S4, V25.S4, V17.S4
	VFMLA V30.S4, V26.S4, V18.S4
	VFMLA V31.S4, V27.S4, V19.S4
	VLD1.P 64(R4), [V28.S4, V29.S4, V30.S4, V31.S4]
	VFMLA V28.S4, V24.S4, V20.S4
	VFMLA V29.S4, V25.S4, V21.S4
	VFMLA V30.S4, V26.S4, V22.S4
	VFMLA V31.S4, V27.S4, V23.S4
	SUBS $1, R6, R6
	BNE d4loop
d4done:
	SUMROW(0, 1, 2, 3)
	SUMROW(4, 5, 6, 7)
	SUMROW(16, 17, 18, 19)
	SUMROW(20, 21, 22, 23)
	MOVD out+32(FP), R0
	MOVD ostride+40(FP), R5
	FMOVS F0, (R0)
	ADD R5, R0, R0
	FMOVS F4, (R0)
	ADD R5, R0, R0
	FMOVS F16, (R0)
	ADD R5, R0, R0
	FMOVS F20, (R0)
	RET

// func readNEON(p *byte, n int) uint64
// readAVX2 on arm64: the sum of the n·256 bytes at p as little-endian
// uint64 words (wrapping), with 64-byte vector loads: a read at the speed
// the memory allows. n ≥ 1.
TEXT ·readNEON(SB), NOSPLIT, $0-24
	MOVD p+0(FP), R0
	MOVD n+8(FP), R1
	VEOR V0.B16, V0.B16, V0.B16
	VEOR V1.B16, V1.B16, V1.B16
	VEOR V2.B16, V2.B16, V2.B16
	VEOR V3.B16, V3.B16, V3.B16
rdloop:
	VLD1.P 64(R0), [V4.D2, V5.D2, V6.D2, V7.D2]
	VADD V4.D2, V0.D2, V0.D2
	VADD V5.D2, V1.D2, V1.D2
	VADD V6.D2, V2.D2, V2.D2
	VADD V7.D2, V3.D2, V3.D2
	VLD1.P 64(R0), [V4.D2, V5.D2, V6.D2, V7.D2]
	VADD V4.D2, V0.D2, V0.D2
	VADD V5.D2, V1.D2, V1.D2
	VADD V6.D2, V2.D2, V2.D2
	VADD V7.D2, V3.D2, V3.D2
	VLD1.P 64(R0), [V4.D2, V5.D2, V6.D2, V7.D2]
	VADD V4.D2, V0.D2, V0.D2
	VADD V5.D2, V1.D2, V1.D2
	VADD V6.D2, V2.D2, V2.D2
	VADD V7.D2, V3.D2, V3.D2
	VLD1.P 64(R0), [V4.D2, V5.D2, V6.D2, V7.D2]
	VADD V4.D2, V0.D2, V0.D2
	VADD V5.D2, V1.D2, V1.D2
	VADD V6.D2, V2.D2, V2.D2
	VADD V7.D2, V3.D2, V3.D2
	SUBS $1, R1, R1
	BNE rdloop
	VADD V1.D2, V0.D2, V0.D2
	VADD V3.D2, V2.D2, V2.D2
	VADD V2.D2, V0.D2, V0.D2
	VMOV V0.D[0], R2
	VMOV V0.D[1], R3
	ADD R3, R2, R2
	MOVD R2, ret+16(FP)
	RET
