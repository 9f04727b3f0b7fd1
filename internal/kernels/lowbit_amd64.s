//go:build amd64

#include "textflag.h"

// The low-bit decode kernel (lowbit.go): 8 weight rows of format.Q3 or
// format.Q2 against one int8 activation row, permuted by lowPerm. Each
// row's group is unpacked in registers and multiplied by the activations
// (VPMADDUBSW into int16 pairs, at most 2·7·127 each, then VPMADDWD to
// int32: the group's sum is exact), the 8 rows' partial sums are folded
// into one vector of group sums (one row per lane), and dotQ4I8's float
// chain runs on it, the 8 rows' scales and biases gathered. Results are
// dotLowI8's, bit for bit.
//
// The constants come from a lowTab at R12: shuf 0, mul 128, ones 256,
// m3 288, shift 320, iota 352.

// DOT3 is one row's q3 group (24 bytes at A; A8 is A+8) times the
// permuted activations at DI; I receives 8 int32 partial sums. Clobbers
// Y8, Y9, Y12.
#define DOT3(A, A8, I) \
	VMOVDQU A, X8 \
	VINSERTI128 $1, A8, Y8, Y8 \
	VPSHUFB 0(R12), Y8, Y9 \
	VPMULLW 128(R12), Y9, Y9 \
	VPSRLW $13, Y9, Y9 \
	VPSHUFB 32(R12), Y8, Y12 \
	VPMULLW 160(R12), Y12, Y12 \
	VPSRLW $13, Y12, Y12 \
	VPACKUSWB Y12, Y9, Y9 \
	VPMADDUBSW (DI), Y9, Y9 \
	VPSHUFB 64(R12), Y8, Y12 \
	VPMULLW 192(R12), Y12, Y12 \
	VPSRLW $13, Y12, Y12 \
	VPSHUFB 96(R12), Y8, Y8 \
	VPMULLW 224(R12), Y8, Y8 \
	VPSRLW $13, Y8, Y8 \
	VPACKUSWB Y8, Y12, Y12 \
	VPMADDUBSW 32(DI), Y12, Y12 \
	VPADDW Y12, Y9, Y9 \
	VPMADDWD 256(R12), Y9, I

// DOT2 is the same for a q2 group (16 bytes at A; A8 unused).
#define DOT2(A, A8, I) \
	VBROADCASTI128 A, Y8 \
	VPSRLVD 320(R12), Y8, Y8 \
	VPAND 288(R12), Y8, Y9 \
	VPSRLW $2, Y8, Y8 \
	VPAND 288(R12), Y8, Y8 \
	VPMADDUBSW (DI), Y9, Y9 \
	VPMADDUBSW 32(DI), Y8, Y8 \
	VPADDW Y8, Y9, Y9 \
	VPMADDWD 256(R12), Y9, I

// Rows at SI, SI+BX, SI+2BX, SI+DX, SI+4BX, R8, R8+BX, R8+2BX.
#define ROWS8(DOT) \
	DOT((SI), 8(SI), Y0) \
	DOT((SI)(BX*1), 8(SI)(BX*1), Y1) \
	DOT((SI)(BX*2), 8(SI)(BX*2), Y2) \
	DOT((SI)(DX*1), 8(SI)(DX*1), Y3) \
	DOT((SI)(BX*4), 8(SI)(BX*4), Y4) \
	DOT((R8), 8(R8), Y5) \
	DOT((R8)(BX*1), 8(R8)(BX*1), Y6) \
	DOT((R8)(BX*2), 8(R8)(BX*2), Y7)

// GROUPEND folds the 8 rows' partial sums to one exact sum per row (lane
// r of Y1 is row r's) and adds s·(scale·xs) + bias·xsum to the rows'
// accumulators Y11; the scales and biases of group g of the 8 rows are
// gathered from R14 and R9 at the offsets in Y14.
#define GROUPEND \
	VPUNPCKLDQ Y1, Y0, Y8 \
	VPUNPCKHDQ Y1, Y0, Y0 \
	VPADDD Y8, Y0, Y0 \
	VPUNPCKLDQ Y3, Y2, Y8 \
	VPUNPCKHDQ Y3, Y2, Y2 \
	VPADDD Y8, Y2, Y2 \
	VPUNPCKLDQ Y5, Y4, Y8 \
	VPUNPCKHDQ Y5, Y4, Y4 \
	VPADDD Y8, Y4, Y4 \
	VPUNPCKLDQ Y7, Y6, Y8 \
	VPUNPCKHDQ Y7, Y6, Y6 \
	VPADDD Y8, Y6, Y6 \
	VPUNPCKLQDQ Y2, Y0, Y8 \
	VPUNPCKHQDQ Y2, Y0, Y0 \
	VPADDD Y8, Y0, Y0 \
	VPUNPCKLQDQ Y6, Y4, Y8 \
	VPUNPCKHQDQ Y6, Y4, Y4 \
	VPADDD Y8, Y4, Y4 \
	VPERM2I128 $0x20, Y4, Y0, Y1 \
	VPERM2I128 $0x31, Y4, Y0, Y2 \
	VPADDD Y2, Y1, Y1 \
	VCVTDQ2PS Y1, Y1 \
	VPCMPEQD Y15, Y15, Y15 \
	VGATHERDPS Y15, (R14)(Y14*4), Y13 \
	VBROADCASTSS (R11), Y12 \
	VMULPS Y13, Y12, Y12 \
	VMULPS Y12, Y1, Y1 \
	VPCMPEQD Y15, Y15, Y15 \
	VGATHERDPS Y15, (R9)(Y14*4), Y13 \
	VBROADCASTSS (R10), Y12 \
	VMULPS Y13, Y12, Y12 \
	VADDPS Y12, Y1, Y1 \
	VADDPS Y1, Y11, Y11 \
	ADDQ $64, DI \
	ADDQ $4, R11 \
	ADDQ $4, R10 \
	ADDQ $4, R14 \
	ADDQ $4, R9

// func lowRows(q *byte, qstride int, scales, biases *float32, ng, n int, x8 *int8, xs, xsum *float32, out *float32, b int, tab *lowTab)
//
// n (a multiple of 8) consecutive weight rows of b bits (3 or 2) from q,
// qstride bytes apart, against one activation row (x8 permuted by
// lowPerm[b]); out[i] receives row i's result.
TEXT ·lowRows(SB), NOSPLIT, $8-96
	MOVQ ng+32(FP), AX
	TESTQ AX, AX
	JEQ done
	MOVQ n+40(FP), AX
	SHRQ $3, AX
	JEQ done
	MOVQ AX, 0(SP)              // tiles left
	MOVQ tab+88(FP), R12
	// Row r's scales are r·ng floats after row 0's.
	MOVQ ng+32(FP), AX
	VMOVQ AX, X14
	VPBROADCASTD X14, Y14
	VPMULLD 352(R12), Y14, Y14
	MOVQ q+0(FP), R13
	MOVQ scales+16(FP), R14
	MOVQ biases+24(FP), R9
	MOVQ out+72(FP), CX
	MOVQ qstride+8(FP), BX
	LEAQ (BX)(BX*2), DX
tile:
	VXORPS Y11, Y11, Y11
	// R15 walks the next tile's weights, 8 groups' worth of bytes per
	// group of this tile, for PREFETCHT0: a decode step's records come
	// from memory, and the hardware prefetchers follow 8 interleaved row
	// streams poorly (as q4Rows). Its scales and biases (ng·32 bytes each
	// after this tile's) are prefetched here. Prefetching past the
	// matrix's end is harmless: prefetches never fault.
	MOVQ BX, R15
	SHLQ $3, R15
	ADDQ R13, R15
	MOVQ ng+32(FP), AX
	SHLQ $5, AX
	LEAQ (R14)(AX*1), SI
	LEAQ (R9)(AX*1), DI
	ADDQ $63, AX
	SHRQ $6, AX
pfs:
	PREFETCHT0 (SI)
	PREFETCHT0 (DI)
	ADDQ $64, SI
	ADDQ $64, DI
	DECQ AX
	JNE pfs
	MOVQ R13, SI
	LEAQ (SI)(BX*4), R8
	ADDQ BX, R8
	MOVQ x8+48(FP), DI
	MOVQ xs+56(FP), R11
	MOVQ xsum+64(FP), R10
	MOVQ ng+32(FP), AX
	CMPQ b+80(FP), $3
	JNE group2
group3:
	PREFETCHT0 (R15)
	PREFETCHT0 64(R15)
	PREFETCHT0 128(R15)
	ADDQ $192, R15
	ROWS8(DOT3)
	GROUPEND
	ADDQ $24, SI
	ADDQ $24, R8
	DECQ AX
	JNE group3
	JMP tiledone
group2:
	PREFETCHT0 (R15)
	PREFETCHT0 64(R15)
	ADDQ $128, R15
	ROWS8(DOT2)
	GROUPEND
	ADDQ $16, SI
	ADDQ $16, R8
	DECQ AX
	JNE group2
tiledone:
	VMOVUPS Y11, (CX)
	ADDQ $32, CX
	MOVQ BX, AX
	SHLQ $3, AX
	ADDQ AX, R13
	// The scales and biases moved on by ng floats: 7·ng more reach the
	// next tile's.
	MOVQ ng+32(FP), AX
	IMULQ $28, AX
	ADDQ AX, R14
	ADDQ AX, R9
	DECQ 0(SP)
	JNE tile
done:
	VZEROUPPER
	RET
