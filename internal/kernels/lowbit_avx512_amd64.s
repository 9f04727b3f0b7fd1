//go:build amd64

#include "textflag.h"
#include "prefetch_amd64.h"

// The AVX-512 low-bit decode kernel (lowbit.go): 16 weight rows of
// format.Q3 or format.Q2 against one int8 activation row, permuted by
// lowPerm like the AVX2 kernel's (lowbit_amd64.s), with the same results:
// dotLowI8's, bit for bit.
//
// One Z register holds a pair of rows' groups, rows r and r+4 (r = 0..3,
// 8..11) in its low and high 256 bits, each half unpacked exactly as the
// AVX2 kernel unpacks a row (see lowbit.go for the q3 byte permutes), so
// the 32-byte halves of the permuted activations, each broadcast to both
// halves, multiply it: two VPDPBUSD (weights' codes unsigned, activations
// signed, four products per int32, exact) leave 16 int32 partial sums,
// 8 per row. Unpacking two rows per instruction at least halves the
// instructions per row against AVX2 and replaces VPMADDUBSW, VPADDW and
// VPMADDWD; the pairing (r, r+4) makes the fold of the 8 pairs' partial
// sums (14 shuffles and 7 adds for 16 rows, against 14 and 7 for AVX2's
// 8) end with lane r holding row r's exact group sum. dotQ4I8's float
// chain then runs on 16 rows at once, their scales and biases gathered.
// With 512-bit instructions in flight an Intel core has two vector ports
// instead of three, so the time falls less than the instruction count:
// on an Emerald Rapids core, from the L2 cache, 0.49 of the AVX2 kernel's
// time at q3 and 0.66 at q2, whose AVX2 unpacking was already short
// (BenchmarkLowRows).
//
// The constants come from a lowTab at R12 during setup: perm3 384,
// mshift3 512, shift2 640, iota16 704; they stay in registers (Z24..Z29)
// throughout.

// DOT3P is a pair of q3 groups (row A's 24 bytes at A, row B's at B, B32
// being B−32) times the activations in Z30 and Z31; I receives row A's
// partial sums in its low half and row B's in its high. The two masked
// loads put A's bytes at 0..23 and B's at 32..55 of Z16 and read no byte
// outside the groups (a row's last group may end the matrix). VPERMB
// gathers each qword's source bytes (Z24, Z25), VPMULTISHIFTQB moves each
// value to the bottom of its byte (Z26, Z27), and Z28 (0x07 per byte)
// clears the neighbours' bits. Clobbers Z16, Z17.
#define DOT3P(A, B, B32, I) \
	VMOVDQU8.Z A, K1, Z16 \
	VMOVDQU8 B32, K2, Z16 \
	VPERMB Z16, Z24, Z17 \
	VPERMB Z16, Z25, Z16 \
	VPMULTISHIFTQB Z17, Z26, Z17 \
	VPMULTISHIFTQB Z16, Z27, Z16 \
	VPANDD Z28, Z17, Z17 \
	VPANDD Z28, Z16, Z16 \
	VPXORD I, I, I \
	VPDPBUSD Z30, Z17, I \
	VPDPBUSD Z31, Z16, I

// DOT2P is the same for a pair of q2 groups (16 bytes at A and B; B32
// unused): row A's bytes broadcast to the four 128-bit lanes, row B's
// merged into lanes 2 and 3 (K3), lanes 1 and 3 shifted right by 4 (Z29),
// then Z28 (0x03 per byte) before and after a further shift by 2, as the
// AVX2 kernel does per row.
#define DOT2P(A, B, B32, I) \
	VBROADCASTI32X4 A, Z16 \
	VBROADCASTI32X4 B, K3, Z16 \
	VPSRLVD Z29, Z16, Z16 \
	VPANDD Z28, Z16, Z17 \
	VPSRLW $2, Z16, Z16 \
	VPANDD Z28, Z16, Z16 \
	VPXORD I, I, I \
	VPDPBUSD Z30, Z17, I \
	VPDPBUSD Z31, Z16, I

// The 8 row pairs of a tile: rows 0..3 at SI, SI+BX, SI+2BX, SI+DX with
// rows 4..7 at the same offsets from R8, rows 8..11 from R9 with rows
// 12..15 from R10 (DX = 3BX, R8 = SI+4BX, R9 = SI+8BX, R10 = SI+12BX).
#define ROWS16(DOT) \
	DOT((SI), (R8), -32(R8), Z0) \
	DOT((SI)(BX*1), (R8)(BX*1), -32(R8)(BX*1), Z1) \
	DOT((SI)(BX*2), (R8)(BX*2), -32(R8)(BX*2), Z2) \
	DOT((SI)(DX*1), (R8)(DX*1), -32(R8)(DX*1), Z3) \
	DOT((R9), (R10), -32(R10), Z4) \
	DOT((R9)(BX*1), (R10)(BX*1), -32(R10)(BX*1), Z5) \
	DOT((R9)(BX*2), (R10)(BX*2), -32(R10)(BX*2), Z6) \
	DOT((R9)(DX*1), (R10)(DX*1), -32(R10)(DX*1), Z7)

// GROUPEND folds the pairs' partial sums to one exact sum per row and
// adds s·(scale·xs) + bias·xsum to the rows' accumulators Z19, as
// dotQ4I8 spells it (each product and sum rounded, no FMA). Within each
// 128-bit lane, dword then qword interleaves of Z0..Z3 (Z4..Z7) leave the
// sums of pairs 0..3 (4..7) side by side: lane 0 and 1 of Z0 hold halves
// of rows 0..3's sums, lanes 2 and 3 halves of rows 4..7's (Z4: rows
// 8..11, 12..15). Gathering lanes 0 and 2, and 1 and 3, of Z0 and Z4
// and adding gives lane r = row r. The scales and biases of the group
// are gathered from R13 and R14 at the rows' offsets in Z18.
#define GROUPEND \
	VPUNPCKLDQ Z1, Z0, Z8 \
	VPUNPCKHDQ Z1, Z0, Z0 \
	VPADDD Z8, Z0, Z0 \
	VPUNPCKLDQ Z3, Z2, Z9 \
	VPUNPCKHDQ Z3, Z2, Z2 \
	VPADDD Z9, Z2, Z2 \
	VPUNPCKLDQ Z5, Z4, Z10 \
	VPUNPCKHDQ Z5, Z4, Z4 \
	VPADDD Z10, Z4, Z4 \
	VPUNPCKLDQ Z7, Z6, Z11 \
	VPUNPCKHDQ Z7, Z6, Z6 \
	VPADDD Z11, Z6, Z6 \
	VPUNPCKLQDQ Z2, Z0, Z8 \
	VPUNPCKHQDQ Z2, Z0, Z0 \
	VPADDD Z8, Z0, Z0 \
	VPUNPCKLQDQ Z6, Z4, Z9 \
	VPUNPCKHQDQ Z6, Z4, Z4 \
	VPADDD Z9, Z4, Z4 \
	VSHUFI64X2 $0x88, Z4, Z0, Z8 \
	VSHUFI64X2 $0xdd, Z4, Z0, Z0 \
	VPADDD Z8, Z0, Z0 \
	VCVTDQ2PS Z0, Z0 \
	KXNORW K4, K4, K4 \
	VGATHERDPS (R13)(Z18*4), K4, Z20 \
	VMULPS.BCST (R11), Z20, Z20 \
	VMULPS Z20, Z0, Z0 \
	KXNORW K5, K5, K5 \
	VGATHERDPS (R14)(Z18*4), K5, Z21 \
	VMULPS.BCST (R12), Z21, Z21 \
	VADDPS Z21, Z0, Z0 \
	VADDPS Z0, Z19, Z19 \
	ADDQ $64, DI \
	ADDQ $4, R11 \
	ADDQ $4, R12 \
	ADDQ $4, R13 \
	ADDQ $4, R14

// The activations of the group: each 32-byte half of x8 (the values that
// vector 0 and vector 1 of a row hold) in both halves of Z30 and Z31.
#define ACTS \
	VBROADCASTI64X4 (DI), Z30 \
	VBROADCASTI64X4 32(DI), Z31

#define L_TILES 0              // tiles left
#define L_Q 8                  // the tile's first row

// func lowRowsVNNI(q *byte, qstride int, scales, biases *float32, ng, n int, x8 *int8, xs, xsum *float32, out *float32, b int, tab *lowTab)
//
// n (a multiple of 16) consecutive weight rows of b bits (3 or 2) from q,
// qstride bytes apart, against one activation row (x8 permuted by
// lowPerm[b]); out[i] receives row i's result.
TEXT ·lowRowsVNNI(SB), NOSPLIT, $16-96
	MOVQ ng+32(FP), AX
	TESTQ AX, AX
	JEQ done
	MOVQ n+40(FP), AX
	SHRQ $4, AX
	JEQ done
	MOVQ AX, L_TILES(SP)
	MOVQ tab+88(FP), R12
	// Row r's scales are r·ng floats after row 0's.
	MOVQ ng+32(FP), AX
	VPBROADCASTD AX, Z18
	VPMULLD 704(R12), Z18, Z18
	// K1 and K2: a q3 group's 24 bytes at byte 0 and at byte 32; K3: the
	// upper two 128-bit lanes.
	MOVQ $0xffffff, AX
	KMOVQ AX, K1
	SHLQ $32, AX
	KMOVQ AX, K2
	MOVL $0xff00, AX
	KMOVW AX, K3
	CMPQ b+80(FP), $3
	JNE const2
	VMOVDQU64 384(R12), Z24
	VMOVDQU64 448(R12), Z25
	VMOVDQU64 512(R12), Z26
	VMOVDQU64 576(R12), Z27
	MOVL $0x07070707, AX
	JMP consts
const2:
	VMOVDQU64 640(R12), Z29
	MOVL $0x03030303, AX
consts:
	VPBROADCASTD AX, Z28
	MOVQ q+0(FP), AX
	MOVQ AX, L_Q(SP)
	MOVQ scales+16(FP), R13
	MOVQ biases+24(FP), R14
	MOVQ out+72(FP), CX
	MOVQ qstride+8(FP), BX
	LEAQ (BX)(BX*2), DX
tile:
	VPXORD Z19, Z19, Z19
	MOVQ L_Q(SP), SI
	// R15 walks the next tile's weights, 16 groups' worth of bytes per
	// group of this tile, for PREFETCHT0, as in the AVX2 kernel: the
	// hardware prefetchers follow 16 interleaved row streams poorly. Its
	// scales and biases (ng·64 bytes each after this tile's) are
	// prefetched here; prefetches never fault.
	MOVQ BX, R15
	SHLQ $4, R15
	ADDQ SI, R15
	MOVQ ng+32(FP), AX
	SHLQ $6, AX
	LEAQ (R13)(AX*1), R8
	LEAQ (R14)(AX*1), R9
	ADDQ $63, AX
	SHRQ $6, AX
pfs:
	PREFETCHT0 (R8)
	PREFETCHT0 (R9)
	ADDQ $64, R8
	ADDQ $64, R9
	DECQ AX
	JNE pfs
	LEAQ (SI)(BX*4), R8
	LEAQ (R8)(BX*4), R9
	LEAQ (R9)(BX*4), R10
	MOVQ x8+48(FP), DI
	MOVQ xs+56(FP), R11
	MOVQ xsum+64(FP), R12
	MOVQ ng+32(FP), AX
	CMPQ b+80(FP), $3
	JNE group2
group3:
	PF4LINES(R15)
	PREFETCHT0 256(R15)
	PREFETCHT0 320(R15)
	ADDQ $384, R15
	ACTS
	ROWS16(DOT3P)
	GROUPEND
	ADDQ $24, SI
	ADDQ $24, R8
	ADDQ $24, R9
	ADDQ $24, R10
	DECQ AX
	JNE group3
	JMP tiledone
group2:
	PF4LINES(R15)
	ADDQ $256, R15
	ACTS
	ROWS16(DOT2P)
	GROUPEND
	ADDQ $16, SI
	ADDQ $16, R8
	ADDQ $16, R9
	ADDQ $16, R10
	DECQ AX
	JNE group2
tiledone:
	VMOVUPS Z19, (CX)
	ADDQ $64, CX
	MOVQ BX, AX
	SHLQ $4, AX
	ADDQ AX, L_Q(SP)
	// The scales and biases moved on by ng floats: 15·ng more reach the
	// next tile's.
	MOVQ ng+32(FP), AX
	IMULQ $60, AX
	ADDQ AX, R13
	ADDQ AX, R14
	DECQ L_TILES(SP)
	JNE tile
done:
	VZEROUPPER
	RET
