//go:build arm64

#include "textflag.h"
#include "neon_arm64.h"

// The multi-row q4 kernel of arm64: four weight rows against one or two
// activation rows per pass, so that each loaded vector of int8 activations
// serves four rows and each unpacked weight vector two activation rows.
// Every result is dotQ4I8's: per group the exact integer sum (SDOT into
// int32 lanes, or SMULL/SMLAL into int16 lanes, at most 8·15·128 each,
// widened by SADDLP), reduced exactly by ADDP to one int32 per row, then
// per row and group, in lanes that never mix, SCVTF, c = scale·xs,
// t = s·c, b = bias·xsum, acc += t + b, each product and sum rounded on
// its own (FMUL and FADD never fuse), in dotQ4I8NEON's operand order.
//
// Registers: V30 the nibble mask; V4-V7 and V16-V19 the 64 activations of
// activation rows A and B; V2, V3 (high nibbles) and V28, V29 (low) one
// weight row's group; V20-V23 and V24-V27 the integer sums of rows 0-3
// against A and B; V0 and V1 the float sums of A and B. V8-V15 are left
// alone. R0-R3 walk the four weight rows, R4-R7 their scales, R8-R11 their
// biases, R12/R13 the int8 activations of A/B, R14/R15 their xs, R16/R17
// their xsum; R19 counts groups.

// ROWSPLIT loads one group (32 bytes) of a weight row and splits it: V28,
// V29 the low nibbles (elements 0-15, 16-31), V2, V3 the high ones
// (32-47, 48-63).
#define ROWSPLIT(Rq) \
	VLD1.P 32(Rq), [V2.B16, V3.B16] \
	VAND V30.B16, V2.B16, V28.B16 \
	VAND V30.B16, V3.B16, V29.B16 \
	VUSHR $4, V2.B16, V2.B16 \
	VUSHR $4, V3.B16, V3.B16

// SDOTACT adds the split row's 64 products with the activations in
// V(x0)..V(x3) into the four int32 lanes of V(a).
#define SDOTACT(a, x0, x1, x2, x3) \
	SDOT(a, 28, x0) \
	SDOT(a, 29, x1) \
	SDOT(a, 2, x2) \
	SDOT(a, 3, x3)

// SMULACT sets V(a) to the same sum in four int32 lanes without SDOT:
// eight int16 lanes of eight products each, then SADDLP.
#define SMULACT(a, x0, x1, x2, x3) \
	SMULL8(a, 28, x0) \
	SMLAL16(a, 28, x0) \
	SMLAL8(a, 29, x1) \
	SMLAL16(a, 29, x1) \
	SMLAL8(a, 2, x2) \
	SMLAL16(a, 2, x2) \
	SMLAL8(a, 3, x3) \
	SMLAL16(a, 3, x3) \
	SADDLP4(a, a)

// REDUCEA sets V20 to the integer sums of rows 0-3 against A (lanes 0-3)
// from V20-V23; REDUCEB V24 from V24-V27. Integer adds: exact.
#define REDUCEA \
	VADDP V21.S4, V20.S4, V20.S4 \
	VADDP V23.S4, V22.S4, V22.S4 \
	VADDP V22.S4, V20.S4, V20.S4

#define REDUCEB \
	VADDP V25.S4, V24.S4, V24.S4 \
	VADDP V27.S4, V26.S4, V26.S4 \
	VADDP V26.S4, V24.S4, V24.S4

// LOADSB gathers the group's scale of rows 0-3 into V28 and bias into V29.
#define LOADSB \
	VLD1.P 4(R4), V28.S[0] \
	VLD1.P 4(R5), V28.S[1] \
	VLD1.P 4(R6), V28.S[2] \
	VLD1.P 4(R7), V28.S[3] \
	VLD1.P 4(R8), V29.S[0] \
	VLD1.P 4(R9), V29.S[1] \
	VLD1.P 4(R10), V29.S[2] \
	VLD1.P 4(R11), V29.S[3]

// FLOATACC is dotQ4I8's float step for the four rows: V(acc) +=
// float32(s)·(scale·xs) + bias·xsum, s in V(s), xs and xsum broadcast from
// Rxs and Rxsum.
#define FLOATACC(s, acc, Rxs, Rxsum) \
	SCVTF4(s, s) \
	VLD1R.P 4(Rxs), [V2.S4] \
	VLD1R.P 4(Rxsum), [V3.S4] \
	FMUL4(2, 28, 2) \
	FMUL4(s, s, 2) \
	FMUL4(3, 29, 3) \
	FADD4(s, s, 3) \
	FADD4(acc, acc, s)

// func q4QuadsNEON(q *byte, qstride int, scales, biases *float32, ng, nq int, x8 *int8, xs, xsum *float32, nb int, out *float32, ostride int, sdot bool)
// Weight rows [0, 4·nq) (qstride bytes apart, their ng scales and biases
// consecutive) against activation rows [0, nb) (ng·64 int8 apart, ng xs and
// xsum each): row i of activation row b is written at out + b·ostride
// bytes + 4i. Loops over quads of weight rows, then pairs of activation
// rows (a last one alone).
TEXT ·q4QuadsNEON(SB), NOSPLIT, $0-97
	MOVD nq+40(FP), R20
	CBZ R20, done
	MOVD nb+72(FP), R0
	CBZ R0, done
	MOVD q+0(FP), R21
	MOVD scales+16(FP), R22
	MOVD biases+24(FP), R23
	VMOVI $15, V30.B16

quad:
	MOVD $0, R26 // activation row b

pair:
	MOVD ng+32(FP), R19
	MUL R26, R19, R16
	MOVD x8+48(FP), R12
	ADD R16<<6, R12, R12 // A: x8 + b·ng·64
	ADD R19<<6, R12, R13 // B: the next row
	MOVD xs+56(FP), R14
	ADD R16<<2, R14, R14
	ADD R19<<2, R14, R15
	MOVD xsum+64(FP), R17
	ADD R16<<2, R17, R16
	ADD R19<<2, R16, R17
	MOVD qstride+8(FP), R4
	MOVD R21, R0
	ADD R4, R0, R1
	ADD R4, R1, R2
	ADD R4, R2, R3
	MOVD R22, R4
	ADD R19<<2, R4, R5
	ADD R19<<2, R5, R6
	ADD R19<<2, R6, R7
	MOVD R23, R8
	ADD R19<<2, R8, R9
	ADD R19<<2, R9, R10
	ADD R19<<2, R10, R11
	VEOR V0.B16, V0.B16, V0.B16
	VEOR V1.B16, V1.B16, V1.B16
	MOVD nb+72(FP), R24
	SUB R26, R24, R24 // activation rows left
	MOVBU sdot+96(FP), R25
	CBZ R19, store
	CMP $2, R24
	BLT single
	CBZ R25, pairsmull

pairsdot:
	VLD1.P 64(R12), [V4.B16, V5.B16, V6.B16, V7.B16]
	VLD1.P 64(R13), [V16.B16, V17.B16, V18.B16, V19.B16]
	VEOR V20.B16, V20.B16, V20.B16
	VEOR V21.B16, V21.B16, V21.B16
	VEOR V22.B16, V22.B16, V22.B16
	VEOR V23.B16, V23.B16, V23.B16
	VEOR V24.B16, V24.B16, V24.B16
	VEOR V25.B16, V25.B16, V25.B16
	VEOR V26.B16, V26.B16, V26.B16
	VEOR V27.B16, V27.B16, V27.B16
	ROWSPLIT(R0)
	SDOTACT(20, 4, 5, 6, 7)
	SDOTACT(24, 16, 17, 18, 19)
	ROWSPLIT(R1)
	SDOTACT(21, 4, 5, 6, 7)
	SDOTACT(25, 16, 17, 18, 19)
	ROWSPLIT(R2)
	SDOTACT(22, 4, 5, 6, 7)
	SDOTACT(26, 16, 17, 18, 19)
	ROWSPLIT(R3)
	SDOTACT(23, 4, 5, 6, 7)
	SDOTACT(27, 16, 17, 18, 19)
	REDUCEA
	REDUCEB
	LOADSB
	FLOATACC(20, 0, R14, R16)
	FLOATACC(24, 1, R15, R17)
	SUBS $1, R19, R19
	BNE pairsdot
	B store

pairsmull:
	VLD1.P 64(R12), [V4.B16, V5.B16, V6.B16, V7.B16]
	VLD1.P 64(R13), [V16.B16, V17.B16, V18.B16, V19.B16]
	ROWSPLIT(R0)
	SMULACT(20, 4, 5, 6, 7)
	SMULACT(24, 16, 17, 18, 19)
	ROWSPLIT(R1)
	SMULACT(21, 4, 5, 6, 7)
	SMULACT(25, 16, 17, 18, 19)
	ROWSPLIT(R2)
	SMULACT(22, 4, 5, 6, 7)
	SMULACT(26, 16, 17, 18, 19)
	ROWSPLIT(R3)
	SMULACT(23, 4, 5, 6, 7)
	SMULACT(27, 16, 17, 18, 19)
	REDUCEA
	REDUCEB
	LOADSB
	FLOATACC(20, 0, R14, R16)
	FLOATACC(24, 1, R15, R17)
	SUBS $1, R19, R19
	BNE pairsmull
	B store

single:
	CBZ R25, singlesmull

singlesdot:
	VLD1.P 64(R12), [V4.B16, V5.B16, V6.B16, V7.B16]
	VEOR V20.B16, V20.B16, V20.B16
	VEOR V21.B16, V21.B16, V21.B16
	VEOR V22.B16, V22.B16, V22.B16
	VEOR V23.B16, V23.B16, V23.B16
	ROWSPLIT(R0)
	SDOTACT(20, 4, 5, 6, 7)
	ROWSPLIT(R1)
	SDOTACT(21, 4, 5, 6, 7)
	ROWSPLIT(R2)
	SDOTACT(22, 4, 5, 6, 7)
	ROWSPLIT(R3)
	SDOTACT(23, 4, 5, 6, 7)
	REDUCEA
	LOADSB
	FLOATACC(20, 0, R14, R16)
	SUBS $1, R19, R19
	BNE singlesdot
	B store

singlesmull:
	VLD1.P 64(R12), [V4.B16, V5.B16, V6.B16, V7.B16]
	ROWSPLIT(R0)
	SMULACT(20, 4, 5, 6, 7)
	ROWSPLIT(R1)
	SMULACT(21, 4, 5, 6, 7)
	ROWSPLIT(R2)
	SMULACT(22, 4, 5, 6, 7)
	ROWSPLIT(R3)
	SMULACT(23, 4, 5, 6, 7)
	REDUCEA
	LOADSB
	FLOATACC(20, 0, R14, R16)
	SUBS $1, R19, R19
	BNE singlesmull

store:
	// out + b·ostride + 16·(the quad's index)
	MOVD nq+40(FP), R0
	SUB R20, R0, R0
	MOVD out+80(FP), R1
	ADD R0<<4, R1, R0
	MOVD ostride+88(FP), R1
	MUL R26, R1, R2
	ADD R2, R0, R0
	VST1 [V0.S4], (R0)
	ADD $1, R26, R26
	CMP $2, R24
	BLT nextpair
	ADD R1, R0, R0
	VST1 [V1.S4], (R0)
	ADD $1, R26, R26

nextpair:
	MOVD nb+72(FP), R24
	CMP R24, R26
	BLT pair
	MOVD qstride+8(FP), R0
	ADD R0<<2, R21, R21
	MOVD ng+32(FP), R0
	ADD R0<<4, R22, R22 // 4 rows of ng float32
	ADD R0<<4, R23, R23
	SUBS $1, R20, R20
	BNE quad

done:
	RET
