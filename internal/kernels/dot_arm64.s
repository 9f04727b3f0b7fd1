//go:build arm64

#include "textflag.h"
#include "neon_arm64.h"

// NEON kernels, each computing exactly its Go twin's arithmetic (canon.go
// and dotQ4I8). Go's assembler lacks FADD, FSUB, FMUL, FADDP and UCVTF on
// vectors, SDOT, SMULL/SMLAL, SADDLV and scalar SCVTF; they are WORD
// encodings, each with the instruction in its comment. V8-V15 are left
// alone.

// Reduce the 16 lanes V0..V3 (lanes 0-3, 4-7, 8-11, 12-15) into F0 in
// sum16's order: lane l+8 into lane l, then hsum8
// ((s0+s4)+(s1+s5))+((s2+s6)+(s3+s7)).
#define SUM16 \
	WORD $0x4e22d400 /* FADD V0.4S, V0.4S, V2.4S */ \
	WORD $0x4e23d421 /* FADD V1.4S, V1.4S, V3.4S */ \
	WORD $0x4e21d400 /* FADD V0.4S, V0.4S, V1.4S */ \
	WORD $0x6e20d400 /* FADDP V0.4S, V0.4S, V0.4S */ \
	WORD $0x7e30d800 /* FADDP S0, V0.2S */

// FMLA16 fuses the 16 floats of V16-V19 times P's lanes (a broadcast
// weight) into the chains A-D, lane by lane.
#define FMLA16(P, A, B, C, D) \
	VFMLA V16.S4, P, A \
	VFMLA V17.S4, P, B \
	VFMLA V18.S4, P, C \
	VFMLA V19.S4, P, D

// func dotF32NEON(w, x *float32, n int) float32
// dotF32 for n a multiple of 16: element i fused (FMLA) into lane i%16.
TEXT ·dotF32NEON(SB), NOSPLIT, $0-28
	MOVD w+0(FP), R0
	MOVD x+8(FP), R1
	MOVD n+16(FP), R2
	VEOR V0.B16, V0.B16, V0.B16
	VEOR V1.B16, V1.B16, V1.B16
	VEOR V2.B16, V2.B16, V2.B16
	VEOR V3.B16, V3.B16, V3.B16
	LSR $4, R2, R2
	CBZ R2, f32done
f32loop:
	VLD1.P 64(R0), [V4.S4, V5.S4, V6.S4, V7.S4]
	VLD1.P 64(R1), [V16.S4, V17.S4, V18.S4, V19.S4]
	VFMLA V16.S4, V4.S4, V0.S4
	VFMLA V17.S4, V5.S4, V1.S4
	VFMLA V18.S4, V6.S4, V2.S4
	VFMLA V19.S4, V7.S4, V3.S4
	SUBS $1, R2, R2
	BNE f32loop
f32done:
	SUM16
	FMOVS F0, ret+24(FP)
	RET

// func dotBF16NEON(w *uint16, x *float32, n int) float32
// dotBF16 for n a multiple of 16. ZIP1/ZIP2 with a zero vector put each
// bf16 word in the high half of a 32-bit lane: its float32 value.
TEXT ·dotBF16NEON(SB), NOSPLIT, $0-28
	MOVD w+0(FP), R0
	MOVD x+8(FP), R1
	MOVD n+16(FP), R2
	VEOR V0.B16, V0.B16, V0.B16
	VEOR V1.B16, V1.B16, V1.B16
	VEOR V2.B16, V2.B16, V2.B16
	VEOR V3.B16, V3.B16, V3.B16
	VEOR V31.B16, V31.B16, V31.B16
	LSR $4, R2, R2
	CBZ R2, bfdone
bfloop:
	VLD1.P 32(R0), [V20.H8, V21.H8]
	VZIP1 V20.H8, V31.H8, V4.H8
	VZIP2 V20.H8, V31.H8, V5.H8
	VZIP1 V21.H8, V31.H8, V6.H8
	VZIP2 V21.H8, V31.H8, V7.H8
	VLD1.P 64(R1), [V16.S4, V17.S4, V18.S4, V19.S4]
	VFMLA V16.S4, V4.S4, V0.S4
	VFMLA V17.S4, V5.S4, V1.S4
	VFMLA V18.S4, V6.S4, V2.S4
	VFMLA V19.S4, V7.S4, V3.S4
	SUBS $1, R2, R2
	BNE bfloop
bfdone:
	SUM16
	FMOVS F0, ret+24(FP)
	RET

// func axpyNEON(y *float32, a float32, x *float32, n int)
// y[i] = a·x[i] + y[i] fused (axpyGo), n a multiple of 16.
TEXT ·axpyNEON(SB), NOSPLIT, $0-32
	MOVD y+0(FP), R0
	FMOVS a+8(FP), F7
	VDUP V7.S[0], V7.S4
	MOVD x+16(FP), R1
	MOVD n+24(FP), R2
	LSR $4, R2, R2
	CBZ R2, axdone
axloop:
	VLD1 (R0), [V0.S4, V1.S4, V2.S4, V3.S4]
	VLD1.P 64(R1), [V16.S4, V17.S4, V18.S4, V19.S4]
	FMLA16(V7.S4, V0.S4, V1.S4, V2.S4, V3.S4)
	VST1.P [V0.S4, V1.S4, V2.S4, V3.S4], 64(R0)
	SUBS $1, R2, R2
	BNE axloop
axdone:
	RET

// func mixAccNEON(o, v *float32, stride, n, hd int, p *float32)
// o[d] += p[j]·v_j[d] over n value rows stride bytes apart, each element
// its fused chain continued in j order (mixAccGo; from a cleared o,
// Attend's Axpy chain); hd a multiple of 16.
TEXT ·mixAccNEON(SB), NOSPLIT, $0-48
	MOVD o+0(FP), R0
	MOVD v+8(FP), R1
	MOVD stride+16(FP), R2
	MOVD n+24(FP), R3
	MOVD hd+32(FP), R4
	MOVD p+40(FP), R5
	LSR $4, R4, R4
	CBZ R4, madone
machunk:
	VLD1 (R0), [V0.S4, V1.S4, V2.S4, V3.S4]
	MOVD R1, R6
	MOVD R5, R7
	MOVD R3, R8
	CBZ R8, mastore
makey:
	VLD1R.P 4(R7), [V7.S4]
	VLD1 (R6), [V16.S4, V17.S4, V18.S4, V19.S4]
	FMLA16(V7.S4, V0.S4, V1.S4, V2.S4, V3.S4)
	ADD R2, R6, R6
	SUBS $1, R8, R8
	BNE makey
mastore:
	VST1.P [V0.S4, V1.S4, V2.S4, V3.S4], 64(R0)
	ADD $64, R1, R1
	SUBS $1, R4, R4
	BNE machunk
madone:
	RET

// func mixAcc2NEON(o1, o2, v *float32, stride, n, hd int, p1, p2 *float32)
// mixAccNEON for two outputs and weights over the same value rows: each
// row's 16 floats are loaded once for both chains.
TEXT ·mixAcc2NEON(SB), NOSPLIT, $0-64
	MOVD o1+0(FP), R0
	MOVD o2+8(FP), R9
	MOVD v+16(FP), R1
	MOVD stride+24(FP), R2
	MOVD n+32(FP), R3
	MOVD hd+40(FP), R4
	MOVD p1+48(FP), R5
	MOVD p2+56(FP), R10
	LSR $4, R4, R4
	CBZ R4, m2done
m2chunk:
	VLD1 (R0), [V0.S4, V1.S4, V2.S4, V3.S4]
	VLD1 (R9), [V20.S4, V21.S4, V22.S4, V23.S4]
	MOVD R1, R6
	MOVD R5, R7
	MOVD R10, R11
	MOVD R3, R8
	CBZ R8, m2store
m2key:
	VLD1R.P 4(R7), [V7.S4]
	VLD1R.P 4(R11), [V24.S4]
	VLD1 (R6), [V16.S4, V17.S4, V18.S4, V19.S4]
	FMLA16(V7.S4, V0.S4, V1.S4, V2.S4, V3.S4)
	FMLA16(V24.S4, V20.S4, V21.S4, V22.S4, V23.S4)
	ADD R2, R6, R6
	SUBS $1, R8, R8
	BNE m2key
m2store:
	VST1.P [V0.S4, V1.S4, V2.S4, V3.S4], 64(R0)
	VST1.P [V20.S4, V21.S4, V22.S4, V23.S4], 64(R9)
	ADD $64, R1, R1
	SUBS $1, R4, R4
	BNE m2chunk
m2done:
	RET

// The float part of dotQ4I8 for one group, the exact integer sum s in
// V20's lane 0: acc (F0) += float32(s)·(scale·xs) + bias·xsum, each
// product and sum rounded on its own (FMULS and FADDS never fuse).
#define Q4FLOAT \
	WORD $0x5e21da94 /* SCVTF S20, S20 */ \
	FMOVS (R1), F21 \
	FMOVS (R4), F22 \
	FMULS F22, F21, F21 \
	FMULS F21, F20, F20 \
	FMOVS (R2), F23 \
	FMOVS (R5), F24 \
	FMULS F24, F23, F23 \
	FADDS F23, F20, F20 \
	FADDS F20, F0, F0 \
	ADD $4, R1, R1 \
	ADD $4, R2, R2 \
	ADD $4, R4, R4 \
	ADD $4, R5, R5

// One group's nibbles and activations: V16, V17 the low nibbles (elements
// 0-15, 16-31), V18, V19 the high ones (32-47, 48-63), V4-V7 the 64 int8
// activations.
#define Q4LOAD \
	VLD1.P 32(R0), [V1.B16, V2.B16] \
	VLD1.P 64(R3), [V4.B16, V5.B16, V6.B16, V7.B16] \
	VAND V30.B16, V1.B16, V16.B16 \
	VAND V30.B16, V2.B16, V17.B16 \
	VUSHR $4, V1.B16, V18.B16 \
	VUSHR $4, V2.B16, V19.B16

// func dotQ4I8NEON(q *byte, scales, biases *float32, x8 *int8, xs, xsum *float32, ng int, sdot bool) float32
// dotQ4I8 for one weight row and one activation row. The group's integer
// sum is exact either way: SDOT (the dot-product extension) into four
// int32 lanes, or, without it, SMULL/SMLAL into eight int16 lanes (eight
// products of at most 15·128 each, no overflow) and SADDLV.
TEXT ·dotQ4I8NEON(SB), NOSPLIT, $0-68
	MOVD q+0(FP), R0
	MOVD scales+8(FP), R1
	MOVD biases+16(FP), R2
	MOVD x8+24(FP), R3
	MOVD xs+32(FP), R4
	MOVD xsum+40(FP), R5
	MOVD ng+48(FP), R6
	MOVBU sdot+56(FP), R7
	VEOR V0.B16, V0.B16, V0.B16
	VMOVI $15, V30.B16
	CBZ R6, i8done
	CBZ R7, i8slow
i8dot:
	Q4LOAD
	VEOR V20.B16, V20.B16, V20.B16
	WORD $0x4e849614 /* SDOT V20.4S, V16.16B, V4.16B */
	WORD $0x4e859634 /* SDOT V20.4S, V17.16B, V5.16B */
	WORD $0x4e869654 /* SDOT V20.4S, V18.16B, V6.16B */
	WORD $0x4e879674 /* SDOT V20.4S, V19.16B, V7.16B */
	VADDV V20.S4, V20
	Q4FLOAT
	SUBS $1, R6, R6
	BNE i8dot
	B i8done
i8slow:
	Q4LOAD
	WORD $0x0e24c214 /* SMULL V20.8H, V16.8B, V4.8B */
	WORD $0x4e248214 /* SMLAL2 V20.8H, V16.16B, V4.16B */
	WORD $0x0e258234 /* SMLAL V20.8H, V17.8B, V5.8B */
	WORD $0x4e258234 /* SMLAL2 V20.8H, V17.16B, V5.16B */
	WORD $0x0e268254 /* SMLAL V20.8H, V18.8B, V6.8B */
	WORD $0x4e268254 /* SMLAL2 V20.8H, V18.16B, V6.16B */
	WORD $0x0e278274 /* SMLAL V20.8H, V19.8B, V7.8B */
	WORD $0x4e278274 /* SMLAL2 V20.8H, V19.16B, V7.16B */
	WORD $0x4e703a94 /* SADDLV S20, V20.8H */
	Q4FLOAT
	SUBS $1, R6, R6
	BNE i8slow
i8done:
	FMOVS F0, ret+64(FP)
	RET

// func deltaRuleNEON(S, k, q, v, kv, o *float32, decay, beta float32, dk, dv int)
// deltaRuleGo for dv a multiple of 4: S = decay·S and kv = Σ_a S[a]·k[a]
// (fused, in row order), kv = (v − kv)·beta, then S[a] += k[a]·kv and
// o = Σ_a S[a]·q[a] (fused, in row order).
TEXT ·deltaRuleNEON(SB), NOSPLIT, $0-72
	MOVD S+0(FP), R0
	MOVD k+8(FP), R1
	MOVD q+16(FP), R2
	MOVD v+24(FP), R3
	MOVD kv+32(FP), R4
	MOVD o+40(FP), R5
	FMOVS decay+48(FP), F30
	VDUP V30.S[0], V30.S4
	FMOVS beta+52(FP), F31
	VDUP V31.S[0], V31.S4
	MOVD dk+56(FP), R6
	MOVD dv+64(FP), R7
	LSR $2, R7, R7
	CBZ R7, drdone
	CBZ R6, drdone
	VEOR V0.B16, V0.B16, V0.B16
	MOVD R4, R8
	MOVD R5, R9
	MOVD R7, R10
drzero:
	VST1.P [V0.S4], 16(R8)
	VST1.P [V0.S4], 16(R9)
	SUBS $1, R10, R10
	BNE drzero
	MOVD R0, R8
	MOVD R1, R11
	MOVD R6, R12
dr1row:
	VLD1R.P 4(R11), [V1.S4]
	MOVD R4, R9
	MOVD R7, R10
dr1col:
	VLD1 (R8), [V2.S4]
	WORD $0x6e3edc42 /* FMUL V2.4S, V2.4S, V30.4S */
	VST1.P [V2.S4], 16(R8)
	VLD1 (R9), [V3.S4]
	VFMLA V1.S4, V2.S4, V3.S4
	VST1.P [V3.S4], 16(R9)
	SUBS $1, R10, R10
	BNE dr1col
	SUBS $1, R12, R12
	BNE dr1row
	MOVD R3, R8
	MOVD R4, R9
	MOVD R7, R10
drmid:
	VLD1.P 16(R8), [V2.S4]
	VLD1 (R9), [V3.S4]
	WORD $0x4ea3d442 /* FSUB V2.4S, V2.4S, V3.4S */
	WORD $0x6e3fdc42 /* FMUL V2.4S, V2.4S, V31.4S */
	VST1.P [V2.S4], 16(R9)
	SUBS $1, R10, R10
	BNE drmid
	MOVD R0, R8
	MOVD R1, R11
	MOVD R2, R13
	MOVD R6, R12
dr2row:
	VLD1R.P 4(R11), [V1.S4]
	VLD1R.P 4(R13), [V4.S4]
	MOVD R4, R9
	MOVD R5, R14
	MOVD R7, R10
dr2col:
	VLD1 (R8), [V2.S4]
	VLD1.P 16(R9), [V3.S4]
	VFMLA V1.S4, V3.S4, V2.S4
	VST1.P [V2.S4], 16(R8)
	VLD1 (R14), [V5.S4]
	VFMLA V4.S4, V2.S4, V5.S4
	VST1.P [V5.S4], 16(R14)
	SUBS $1, R10, R10
	BNE dr2col
	SUBS $1, R12, R12
	BNE dr2row
drdone:
	RET

// 16 q8 weights (bytes, widened exactly to float32 in V4-V7) fused with
// their 16 activations into lanes V0-V3 (element j into lane j%16).
#define Q8STEP \
	VLD1.P 16(R0), [V16.B16] \
	VUXTL V16.B8, V17.H8 \
	VUXTL2 V16.B16, V18.H8 \
	VUXTL V17.H4, V4.S4 \
	VUXTL2 V17.H8, V5.S4 \
	VUXTL V18.H4, V6.S4 \
	VUXTL2 V18.H8, V7.S4 \
	WORD $0x6e21d884 /* UCVTF V4.4S, V4.4S */ \
	WORD $0x6e21d8a5 /* UCVTF V5.4S, V5.4S */ \
	WORD $0x6e21d8c6 /* UCVTF V6.4S, V6.4S */ \
	WORD $0x6e21d8e7 /* UCVTF V7.4S, V7.4S */ \
	VLD1.P 64(R3), [V20.S4, V21.S4, V22.S4, V23.S4] \
	VFMLA V20.S4, V4.S4, V0.S4 \
	VFMLA V21.S4, V5.S4, V1.S4 \
	VFMLA V22.S4, V6.S4, V2.S4 \
	VFMLA V23.S4, V7.S4, V3.S4

// func dotQ8NEON(q *byte, scales, biases, x, xsum *float32, ng int) float32
// dotQ8: per group the 64 products fused into lanes j%16, lane l+8 added
// to lane l, each of the 8 lanes accumulating scale·lane fused across
// groups (V24, V25); the rounded bias·xsum terms summed in F26 and added
// after the lanes' hsum8.
TEXT ·dotQ8NEON(SB), NOSPLIT, $0-52
	MOVD q+0(FP), R0
	MOVD scales+8(FP), R1
	MOVD biases+16(FP), R2
	MOVD x+24(FP), R3
	MOVD xsum+32(FP), R4
	MOVD ng+40(FP), R5
	VEOR V24.B16, V24.B16, V24.B16
	VEOR V25.B16, V25.B16, V25.B16
	VEOR V26.B16, V26.B16, V26.B16
	CBZ R5, q8done
q8loop:
	VEOR V0.B16, V0.B16, V0.B16
	VEOR V1.B16, V1.B16, V1.B16
	VEOR V2.B16, V2.B16, V2.B16
	VEOR V3.B16, V3.B16, V3.B16
	Q8STEP
	Q8STEP
	Q8STEP
	Q8STEP
	WORD $0x4e22d400 /* FADD V0.4S, V0.4S, V2.4S */
	WORD $0x4e23d421 /* FADD V1.4S, V1.4S, V3.4S */
	VLD1R.P 4(R1), [V19.S4]
	VFMLA V0.S4, V19.S4, V24.S4
	VFMLA V1.S4, V19.S4, V25.S4
	FMOVS (R2), F27
	FMOVS (R4), F28
	FMULS F28, F27, F27
	FADDS F27, F26, F26
	ADD $4, R2, R2
	ADD $4, R4, R4
	SUBS $1, R5, R5
	BNE q8loop
q8done:
	WORD $0x4e39d718 /* FADD V24.4S, V24.4S, V25.4S */
	WORD $0x6e38d718 /* FADDP V24.4S, V24.4S, V24.4S */
	WORD $0x7e30db18 /* FADDP S24, V24.2S */
	FADDS F26, F24, F24
	FMOVS F24, ret+48(FP)
	RET

// func quantizeRow8NEON(x8 *int8, xs, x *float32, ng int)
// quantizeRow8Go: per group of 64, m = max |x| (exact in any order, FMAX
// being Go's max), s = m/127 stored in xs, inv = 1/s where s > 0 (false
// for NaN) else 0, and x8 = int8(int32((x·inv + 1.5·2^23) − 1.5·2^23)):
// the product rounded before the sum, FCVTZS (saturating, 0 for NaN, as
// Go's conversion on arm64), then the low byte (UZP1 twice).
TEXT ·quantizeRow8NEON(SB), NOSPLIT, $0-32
	MOVD x8+0(FP), R0
	MOVD xs+8(FP), R1
	MOVD x+16(FP), R2
	MOVD ng+24(FP), R3
	CBZ R3, qrdone
	MOVW $0x4b400000, R4 // 1.5·2^23
	VDUP R4, V30.S4
	MOVW $0x42fe0000, R4 // 127
	FMOVS R4, F29
	FMOVS $1.0, F28
qrgroup:
	MOVD R2, R5
	VEOR V0.B16, V0.B16, V0.B16
	VEOR V1.B16, V1.B16, V1.B16
	VEOR V2.B16, V2.B16, V2.B16
	VEOR V3.B16, V3.B16, V3.B16
	MOVD $4, R6
qrmax:
	VLD1.P 64(R5), [V16.S4, V17.S4, V18.S4, V19.S4]
	FABS4(16, 16)
	FABS4(17, 17)
	FABS4(18, 18)
	FABS4(19, 19)
	FMAX4(0, 0, 16)
	FMAX4(1, 1, 17)
	FMAX4(2, 2, 18)
	FMAX4(3, 3, 19)
	SUBS $1, R6, R6
	BNE qrmax
	FMAX4(0, 0, 1)
	FMAX4(2, 2, 3)
	FMAX4(0, 0, 2)
	FMAXV4(0, 0)
	FDIVS F29, F0, F0 // s = m/127
	FMOVS.P F0, 4(R1)
	VEOR V1.B16, V1.B16, V1.B16
	FCMPS $(0.0), F0
	BLE qrzero // s ≤ 0 or NaN: inv = 0
	FDIVS F0, F28, F1
qrzero:
	VDUP V1.S[0], V1.S4
	MOVD $4, R6
qrquant:
	VLD1.P 64(R2), [V16.S4, V17.S4, V18.S4, V19.S4]
	FMUL4(16, 16, 1)
	FMUL4(17, 17, 1)
	FMUL4(18, 18, 1)
	FMUL4(19, 19, 1)
	FADD4(16, 16, 30)
	FADD4(17, 17, 30)
	FADD4(18, 18, 30)
	FADD4(19, 19, 30)
	FSUB4(16, 16, 30)
	FSUB4(17, 17, 30)
	FSUB4(18, 18, 30)
	FSUB4(19, 19, 30)
	FCVTZS4(16, 16)
	FCVTZS4(17, 17)
	FCVTZS4(18, 18)
	FCVTZS4(19, 19)
	VUZP1 V17.H8, V16.H8, V20.H8
	VUZP1 V19.H8, V18.H8, V21.H8
	VUZP1 V21.B16, V20.B16, V22.B16
	VST1.P [V22.B16], 16(R0)
	SUBS $1, R6, R6
	BNE qrquant
	SUBS $1, R3, R3
	BNE qrgroup
qrdone:
	RET
