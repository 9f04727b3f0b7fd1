//go:build amd64

#include "textflag.h"

// The AVX-512 q4 tile kernel: one call computes 16 consecutive weight rows
// (one per lane of a Z register) against every activation row, in the
// arithmetic of dotQ4I8 (quant8.go), which every q4 kernel shares.
//
// A call works through the columns in chunks of up to KC groups. For each
// chunk it first rewrites the tile's weights into its frame, transposed so
// that one 64-byte vector holds the same four consecutive elements of all
// 16 rows, nibbles already split to bytes; then VPDPBUSD multiplies such a
// vector by four activation bytes broadcast from memory, so an activation
// row is read in its natural layout and each instruction does 64
// multiply-adds for 16 different outputs. The transposition is paid once
// per tile and chunk and shared by every activation row; on this design the
// kernel runs at about two thirds of the VPDPBUSD throughput bound, the
// rest being the float part (6 operations per row and group, for 16
// outputs) and the transposition.

#define KC 8
#define TGROUP 1152            // per group in the frame: 16 vectors, scales, biases
#define TSCALE 1024
#define TBIAS 1088

// Frame: locals, then (64-byte aligned) a staging copy of a partial tile's
// rows (each KC*32 bytes of weights; after the 16 rows, the scales then the
// biases, 32 bytes per row, at the same stride) and the transposed chunk
// [KC][TGROUP].
#define L_G0 0                 // first group of the chunk
#define L_KG 8                 // groups in the chunk
#define L_ROWS 16              // activation rows left
#define L_X8 24                // activation pointers of the current block of rows
#define L_XS 32
#define L_XSUM 40
#define L_OUT 48
#define L_T 56                 // transposed chunk (aligned)
#define L_STAGE 64             // staging rows (aligned)
#define L_FSTRIDE 72
#define L_WSRC 80              // transposition sources and strides
#define L_WSTR 88
#define L_SSRC 96
#define L_BSRC 104
#define L_SSTR 112
#define FRAME_ALIGN 128
#define STAGE_BYTES 8192
#define STAGE_SCALES 4096      // from a staging row, its scales
#define STAGE_BIASES 4128      // and its biases
// Frame size 17600 = 128 + 64 + STAGE_BYTES + KC*TGROUP (written out in
// TEXT for vet).

// Transposition indices (VPERMT2D; bit 4 selects the second table). Level 1
// turns two registers of two rows × 8 dwords into rows 4q..4q+3 × dwords
// 0..3 (I1A) or 4..7 (I1B), lane = dword*4 + row; level 2 pairs two of those
// into rows 0..7 × two dwords, lane = dword*8 + row; level 3 (VSHUFI64X2)
// joins rows 0..7 and 8..15.
DATA q4tperm<>+0(SB)/4, $0
DATA q4tperm<>+4(SB)/4, $8
DATA q4tperm<>+8(SB)/4, $16
DATA q4tperm<>+12(SB)/4, $24
DATA q4tperm<>+16(SB)/4, $1
DATA q4tperm<>+20(SB)/4, $9
DATA q4tperm<>+24(SB)/4, $17
DATA q4tperm<>+28(SB)/4, $25
DATA q4tperm<>+32(SB)/4, $2
DATA q4tperm<>+36(SB)/4, $10
DATA q4tperm<>+40(SB)/4, $18
DATA q4tperm<>+44(SB)/4, $26
DATA q4tperm<>+48(SB)/4, $3
DATA q4tperm<>+52(SB)/4, $11
DATA q4tperm<>+56(SB)/4, $19
DATA q4tperm<>+60(SB)/4, $27
DATA q4tperm<>+64(SB)/4, $4
DATA q4tperm<>+68(SB)/4, $12
DATA q4tperm<>+72(SB)/4, $20
DATA q4tperm<>+76(SB)/4, $28
DATA q4tperm<>+80(SB)/4, $5
DATA q4tperm<>+84(SB)/4, $13
DATA q4tperm<>+88(SB)/4, $21
DATA q4tperm<>+92(SB)/4, $29
DATA q4tperm<>+96(SB)/4, $6
DATA q4tperm<>+100(SB)/4, $14
DATA q4tperm<>+104(SB)/4, $22
DATA q4tperm<>+108(SB)/4, $30
DATA q4tperm<>+112(SB)/4, $7
DATA q4tperm<>+116(SB)/4, $15
DATA q4tperm<>+120(SB)/4, $23
DATA q4tperm<>+124(SB)/4, $31
DATA q4tperm<>+128(SB)/4, $0
DATA q4tperm<>+132(SB)/4, $1
DATA q4tperm<>+136(SB)/4, $2
DATA q4tperm<>+140(SB)/4, $3
DATA q4tperm<>+144(SB)/4, $16
DATA q4tperm<>+148(SB)/4, $17
DATA q4tperm<>+152(SB)/4, $18
DATA q4tperm<>+156(SB)/4, $19
DATA q4tperm<>+160(SB)/4, $4
DATA q4tperm<>+164(SB)/4, $5
DATA q4tperm<>+168(SB)/4, $6
DATA q4tperm<>+172(SB)/4, $7
DATA q4tperm<>+176(SB)/4, $20
DATA q4tperm<>+180(SB)/4, $21
DATA q4tperm<>+184(SB)/4, $22
DATA q4tperm<>+188(SB)/4, $23
DATA q4tperm<>+192(SB)/4, $8
DATA q4tperm<>+196(SB)/4, $9
DATA q4tperm<>+200(SB)/4, $10
DATA q4tperm<>+204(SB)/4, $11
DATA q4tperm<>+208(SB)/4, $24
DATA q4tperm<>+212(SB)/4, $25
DATA q4tperm<>+216(SB)/4, $26
DATA q4tperm<>+220(SB)/4, $27
DATA q4tperm<>+224(SB)/4, $12
DATA q4tperm<>+228(SB)/4, $13
DATA q4tperm<>+232(SB)/4, $14
DATA q4tperm<>+236(SB)/4, $15
DATA q4tperm<>+240(SB)/4, $28
DATA q4tperm<>+244(SB)/4, $29
DATA q4tperm<>+248(SB)/4, $30
DATA q4tperm<>+252(SB)/4, $31
GLOBL q4tperm<>(SB), RODATA|NOPTR, $256

// Transposition of 16 rows × 8 dwords (rows at SI, SI+BX, SI+2BX, SI+DX,
// SI+4BX, R8.., R9.., R10 with DX = 3BX, R8 = SI+5BX, R9 = SI+10BX, R10 =
// SI+15BX) into Z16..Z23, vector j holding dword j of every row.
// TLOADW loads 32 bytes per row; TLOADS loads the first kg dwords (mask K3,
// K4 = K3<<8 for the upper half, where the masked load starts 32 bytes early
// so that its upper lanes see the row) and no byte past them.
#define TLOADW \
	VMOVDQU (SI), Y0 \
	VINSERTI64X4 $1, (SI)(BX*1), Z0, Z0 \
	VMOVDQU (SI)(BX*2), Y1 \
	VINSERTI64X4 $1, (SI)(DX*1), Z1, Z1 \
	VMOVDQU (SI)(BX*4), Y2 \
	VINSERTI64X4 $1, (R8), Z2, Z2 \
	VMOVDQU (R8)(BX*1), Y3 \
	VINSERTI64X4 $1, (R8)(BX*2), Z3, Z3 \
	VMOVDQU (R8)(DX*1), Y4 \
	VINSERTI64X4 $1, (R8)(BX*4), Z4, Z4 \
	VMOVDQU (R9), Y5 \
	VINSERTI64X4 $1, (R9)(BX*1), Z5, Z5 \
	VMOVDQU (R9)(BX*2), Y6 \
	VINSERTI64X4 $1, (R9)(DX*1), Z6, Z6 \
	VMOVDQU (R9)(BX*4), Y7 \
	VINSERTI64X4 $1, (R10), Z7, Z7

#define TLOADS \
	VMOVDQU32.Z (SI), K3, Z0 \
	VMOVDQU32 -32(SI)(BX*1), K4, Z0 \
	VMOVDQU32.Z (SI)(BX*2), K3, Z1 \
	VMOVDQU32 -32(SI)(DX*1), K4, Z1 \
	VMOVDQU32.Z (SI)(BX*4), K3, Z2 \
	VMOVDQU32 -32(R8), K4, Z2 \
	VMOVDQU32.Z (R8)(BX*1), K3, Z3 \
	VMOVDQU32 -32(R8)(BX*2), K4, Z3 \
	VMOVDQU32.Z (R8)(DX*1), K3, Z4 \
	VMOVDQU32 -32(R8)(BX*4), K4, Z4 \
	VMOVDQU32.Z (R9), K3, Z5 \
	VMOVDQU32 -32(R9)(BX*1), K4, Z5 \
	VMOVDQU32.Z (R9)(BX*2), K3, Z6 \
	VMOVDQU32 -32(R9)(DX*1), K4, Z6 \
	VMOVDQU32.Z (R9)(BX*4), K3, Z7 \
	VMOVDQU32 -32(R10), K4, Z7

// Z0..Z7 hold rows (2p, 2p+1). Level 1 makes row quads (dwords 0..3 stay
// in Z0, Z2, Z4, Z6, dwords 4..7 go to Z8..Z11), level 2 row octets by
// dword pairs, level 3 (VSHUFI64X2) joins rows 0-7 and 8-15.
#define TNET \
	VMOVDQA64 Z0, Z8 \
	VPERMT2D Z1, Z24, Z0 \
	VPERMT2D Z1, Z25, Z8 \
	VMOVDQA64 Z2, Z9 \
	VPERMT2D Z3, Z24, Z2 \
	VPERMT2D Z3, Z25, Z9 \
	VMOVDQA64 Z4, Z10 \
	VPERMT2D Z5, Z24, Z4 \
	VPERMT2D Z5, Z25, Z10 \
	VMOVDQA64 Z6, Z11 \
	VPERMT2D Z7, Z24, Z6 \
	VPERMT2D Z7, Z25, Z11 \
	VMOVDQA64 Z0, Z12 \
	VPERMT2D Z2, Z26, Z0 \
	VPERMT2D Z2, Z27, Z12 \
	VMOVDQA64 Z4, Z13 \
	VPERMT2D Z6, Z26, Z4 \
	VPERMT2D Z6, Z27, Z13 \
	VMOVDQA64 Z8, Z14 \
	VPERMT2D Z9, Z26, Z8 \
	VPERMT2D Z9, Z27, Z14 \
	VMOVDQA64 Z10, Z15 \
	VPERMT2D Z11, Z26, Z10 \
	VPERMT2D Z11, Z27, Z15 \
	VSHUFI64X2 $0x44, Z4, Z0, Z16 \
	VSHUFI64X2 $0xEE, Z4, Z0, Z17 \
	VSHUFI64X2 $0x44, Z13, Z12, Z18 \
	VSHUFI64X2 $0xEE, Z13, Z12, Z19 \
	VSHUFI64X2 $0x44, Z10, Z8, Z20 \
	VSHUFI64X2 $0xEE, Z10, Z8, Z21 \
	VSHUFI64X2 $0x44, Z15, Z14, Z22 \
	VSHUFI64X2 $0xEE, Z15, Z14, Z23

// Row pointers for the transposition: SI row 0, BX the row stride.
#define TROWS \
	LEAQ (BX)(BX*2), DX \
	LEAQ (SI)(BX*4), R8 \
	ADDQ BX, R8 \
	LEAQ (R8)(BX*4), R9 \
	ADDQ BX, R9 \
	LEAQ (R9)(BX*4), R10 \
	ADDQ BX, R10

// Store the 8 transposed dwords (one per group of the chunk) at offset off
// of each group's block.
#define TSTOREF(off) \
	VMOVDQU32 Z16, (off+0*TGROUP)(DI) \
	VMOVDQU32 Z17, (off+1*TGROUP)(DI) \
	VMOVDQU32 Z18, (off+2*TGROUP)(DI) \
	VMOVDQU32 Z19, (off+3*TGROUP)(DI) \
	VMOVDQU32 Z20, (off+4*TGROUP)(DI) \
	VMOVDQU32 Z21, (off+5*TGROUP)(DI) \
	VMOVDQU32 Z22, (off+6*TGROUP)(DI) \
	VMOVDQU32 Z23, (off+7*TGROUP)(DI)

// One transposed weight vector (dword j of the 16 rows): store its low
// nibbles as vector j and its high nibbles as vector 8+j.
#define TSTORE(V, j) \
	VPANDD Z30, V, Z28 \
	VMOVDQU32 Z28, (j*64)(DI) \
	VPSRLW $4, V, V \
	VPANDD Z30, V, V \
	VMOVDQU32 V, ((8+j)*64)(DI)

// Integer part of one group for 8 activation rows (x8 rows at DI, DI+BX,
// DI+2BX, DI+DX, DI+4BX, R13+2BX, R13+DX, R13+4BX; DX = 3BX, R13 = DI+DX):
// vector m of the transposed group times activation bytes 4m..4m+3.
#define DP8(m) \
	VMOVDQU32 (m*64)(SI), Z16 \
	VPDPBUSD.BCST (m*4)(DI), Z16, Z0 \
	VPDPBUSD.BCST (m*4)(DI)(BX*1), Z16, Z1 \
	VPDPBUSD.BCST (m*4)(DI)(BX*2), Z16, Z2 \
	VPDPBUSD.BCST (m*4)(DI)(DX*1), Z16, Z3 \
	VPDPBUSD.BCST (m*4)(DI)(BX*4), Z16, Z4 \
	VPDPBUSD.BCST (m*4)(R13)(BX*2), Z16, Z5 \
	VPDPBUSD.BCST (m*4)(R13)(DX*1), Z16, Z6 \
	VPDPBUSD.BCST (m*4)(R13)(BX*4), Z16, Z7

// Fewer rows: two (4 rows) or four (2 rows, 1 row) accumulators per row,
// over alternating m, keep eight or four independent VPDPBUSD chains in
// flight to cover its latency; the partial sums are exact, so adding them
// afterwards changes nothing.
#define DP4(m, a, b, c, d) \
	VMOVDQU32 (m*64)(SI), Z16 \
	VPDPBUSD.BCST (m*4)(DI), Z16, a \
	VPDPBUSD.BCST (m*4)(DI)(BX*1), Z16, b \
	VPDPBUSD.BCST (m*4)(DI)(BX*2), Z16, c \
	VPDPBUSD.BCST (m*4)(DI)(DX*1), Z16, d

#define DP2(m, a, b) \
	VMOVDQU32 (m*64)(SI), Z16 \
	VPDPBUSD.BCST (m*4)(DI), Z16, a \
	VPDPBUSD.BCST (m*4)(DI)(BX*1), Z16, b

#define DP1(m, a) \
	VMOVDQU32 (m*64)(SI), Z16 \
	VPDPBUSD.BCST (m*4)(DI), Z16, a

// Float part of one group for one activation row: S holds the 16 exact
// integer dot products, Z18 the 16 weight scales, Z19 the biases.
//   acc += s·(scale·xs) + bias·xsum
// as dotQ4I8 spells it (each product and sum rounded, no FMA).
#define FL(xsa, xsuma, S, ACC) \
	VCVTDQ2PS S, S \
	VMULPS.BCST xsa, Z18, Z20 \
	VMULPS Z20, S, S \
	VMULPS.BCST xsuma, Z19, Z21 \
	VADDPS Z21, S, S \
	VADDPS S, ACC, ACC

// Accumulators of a block of rows: zero for the first chunk, else the
// partial sums the previous chunk left in out (AX walks the rows, CX is the
// out stride; K2 masks the lanes of rows this call owns).
#define ACCIN(ACC) \
	VMOVUPS.Z (AX), K2, ACC \
	ADDQ CX, AX

#define ACCOUT(ACC) \
	VMOVUPS ACC, K2, (AX) \
	ADDQ CX, AX

// Pointers of a block of rows: DI x8, R11 xs, R10 xsum; BX = C, DX = 3C,
// R12 = fstride, R9 = 3·fstride; R13 = DI+3C, R8 = R11+3f, AX = R10+3f.
#define BLOCKPTRS \
	MOVQ L_X8(SP), DI \
	MOVQ L_XS(SP), R11 \
	MOVQ L_XSUM(SP), R10 \
	MOVQ qstride+8(FP), BX \
	SHLQ $1, BX \
	LEAQ (BX)(BX*2), DX \
	MOVQ L_FSTRIDE(SP), R12 \
	LEAQ (R12)(R12*2), R9 \
	LEAQ (DI)(DX*1), R13 \
	LEAQ (R11)(R9*1), R8 \
	LEAQ (R10)(R9*1), AX \
	MOVQ L_T(SP), SI \
	MOVQ L_KG(SP), CX

#define ADVANCE \
	ADDQ $TGROUP, SI \
	ADDQ $64, DI \
	ADDQ $64, R13 \
	ADDQ $4, R11 \
	ADDQ $4, R8 \
	ADDQ $4, R10 \
	ADDQ $4, AX

// func q4TileVNNI(q *byte, qstride int, scales, biases *float32, ng, nrows, nout int, x8 *int8, xs, xsum *float32, nb int, out *float32, ostride int)
//
// q, scales and biases point at the tile's first row (qstride bytes per row
// of q, ng groups); rows at and past nrows do not exist and read as copies
// of row nrows-1; only the first nout lanes are stored. x8 (C = 2·qstride
// bytes per row), xs and xsum (ng floats per row) hold nb activation rows;
// out[r·ostride bytes + lane] receives row r's result for tile row lane.
TEXT ·q4TileVNNI(SB), 0, $17600-104
	MOVQ ng+32(FP), AX
	TESTQ AX, AX
	JEQ done
	MOVQ nb+80(FP), BX
	TESTQ BX, BX
	JEQ done
	SHLQ $2, AX
	MOVQ AX, L_FSTRIDE(SP)
	LEAQ (FRAME_ALIGN+63)(SP), AX
	ANDQ $~63, AX
	MOVQ AX, L_STAGE(SP)
	ADDQ $STAGE_BYTES, AX
	MOVQ AX, L_T(SP)

	// Constants that live through the call: transposition indices in
	// Z24..Z27, the nibble mask in Z30, the store mask in K2.
	VMOVDQU32 q4tperm<>+0(SB), Z24
	VMOVDQU32 q4tperm<>+64(SB), Z25
	VMOVDQU32 q4tperm<>+128(SB), Z26
	VMOVDQU32 q4tperm<>+192(SB), Z27
	MOVL $0x0F0F0F0F, AX
	VPBROADCASTD AX, Z30
	MOVQ nout+48(FP), CX
	MOVL $1, AX
	SHLL CX, AX
	DECL AX
	KMOVW AX, K2

	MOVQ $0, L_G0(SP)

chunk:
	MOVQ ng+32(FP), AX
	SUBQ L_G0(SP), AX
	CMPQ AX, $KC
	JLE kgset
	MOVQ $KC, AX
kgset:
	MOVQ AX, L_KG(SP)
	MOVQ AX, CX
	MOVL $1, AX
	SHLL CX, AX
	DECL AX
	KMOVW AX, K3                // the chunk's groups
	KSHIFTLW $8, K3, K4

	// Sources of the transposition: the rows themselves, or for a partial
	// tile a staging copy in which the missing rows repeat row nrows-1.
	MOVQ L_G0(SP), AX
	MOVQ q+0(FP), SI
	SHLQ $5, AX
	ADDQ AX, SI
	MOVQ SI, L_WSRC(SP)         // q + g0*32
	MOVQ qstride+8(FP), BX
	MOVQ BX, L_WSTR(SP)
	SHRQ $3, AX
	MOVQ scales+16(FP), SI
	ADDQ AX, SI
	MOVQ SI, L_SSRC(SP)         // scales + g0*4
	MOVQ biases+24(FP), SI
	ADDQ AX, SI
	MOVQ SI, L_BSRC(SP)
	MOVQ L_FSTRIDE(SP), AX
	MOVQ AX, L_SSTR(SP)
	CMPQ nrows+40(FP), $16
	JGE transpose
	MOVQ nrows+40(FP), R12
	DECQ R12
	XORQ CX, CX                 // tile row
	MOVQ L_STAGE(SP), DI
stagerow:
	MOVQ CX, AX
	CMPQ AX, R12
	CMOVQGT R12, AX             // the row, clamped
	MOVQ AX, R11
	IMULQ L_WSTR(SP), AX
	ADDQ L_WSRC(SP), AX
	MOVQ DI, R8
	MOVQ L_KG(SP), DX
stagegrp:
	VMOVDQU (AX), Y0
	VMOVDQU Y0, (R8)
	ADDQ $32, AX
	ADDQ $32, R8
	DECQ DX
	JNE stagegrp
	IMULQ L_SSTR(SP), R11
	MOVQ L_SSRC(SP), AX
	VMOVDQU32.Z (AX)(R11*1), K3, Y0
	VMOVDQU Y0, (STAGE_SCALES)(DI)
	MOVQ L_BSRC(SP), AX
	VMOVDQU32.Z (AX)(R11*1), K3, Y0
	VMOVDQU Y0, (STAGE_BIASES)(DI)
	ADDQ $(KC*32), DI
	INCQ CX
	CMPQ CX, $16
	JLT stagerow
	MOVQ L_STAGE(SP), SI
	MOVQ SI, L_WSRC(SP)
	MOVQ $(KC*32), L_WSTR(SP)
	ADDQ $STAGE_SCALES, SI
	MOVQ SI, L_SSRC(SP)
	ADDQ $(STAGE_BIASES-STAGE_SCALES), SI
	MOVQ SI, L_BSRC(SP)
	MOVQ $(KC*32), L_SSTR(SP)

transpose:
	MOVQ L_T(SP), DI
	CMPQ ng+32(FP), $1
	JNE tscales
	// One group per row: the tile's scales are consecutive (the rows that
	// do not exist masked off).
	MOVQ nrows+40(FP), CX
	MOVL $1, AX
	SHLL CX, AX
	DECL AX
	KMOVW AX, K5
	MOVQ scales+16(FP), SI
	VMOVDQU32.Z (SI), K5, Z16
	VMOVDQU32 Z16, TSCALE(DI)
	MOVQ biases+24(FP), SI
	VMOVDQU32.Z (SI), K5, Z16
	VMOVDQU32 Z16, TBIAS(DI)
	JMP tweights
tscales:
	// Scales and biases: 16 rows × kg floats each.
	MOVQ L_SSRC(SP), SI
	MOVQ L_SSTR(SP), BX
	TROWS
	TLOADS
	TNET
	TSTOREF(TSCALE)
	MOVQ L_BSRC(SP), SI
	TROWS
	TLOADS
	TNET
	TSTOREF(TBIAS)
tweights:
	// The weights, a group at a time.
	MOVQ L_WSRC(SP), SI
	MOVQ L_WSTR(SP), BX
	TROWS
	MOVQ L_KG(SP), CX
tgroup:
	TLOADW
	TNET
	TSTORE(Z16, 0)
	TSTORE(Z17, 1)
	TSTORE(Z18, 2)
	TSTORE(Z19, 3)
	TSTORE(Z20, 4)
	TSTORE(Z21, 5)
	TSTORE(Z22, 6)
	TSTORE(Z23, 7)
	ADDQ $32, SI
	ADDQ $32, R8
	ADDQ $32, R9
	ADDQ $32, R10
	ADDQ $TGROUP, DI
	DECQ CX
	JNE tgroup

	// The activation rows, in blocks of 8, 4, 2 and 1.
	MOVQ L_G0(SP), AX
	MOVQ x8+56(FP), BX
	SHLQ $6, AX
	ADDQ AX, BX
	MOVQ BX, L_X8(SP)           // x8 + g0*64
	SHRQ $4, AX
	MOVQ xs+64(FP), BX
	ADDQ AX, BX
	MOVQ BX, L_XS(SP)
	MOVQ xsum+72(FP), BX
	ADDQ AX, BX
	MOVQ BX, L_XSUM(SP)
	MOVQ out+88(FP), AX
	MOVQ AX, L_OUT(SP)
	MOVQ nb+80(FP), AX
	MOVQ AX, L_ROWS(SP)

blocks:
	MOVQ L_ROWS(SP), AX
	CMPQ AX, $8
	JGE block8
	CMPQ AX, $4
	JGE block4
	CMPQ AX, $2
	JGE block2
	CMPQ AX, $1
	JGE block1
	// Chunk done.
	MOVQ L_G0(SP), AX
	ADDQ $KC, AX
	MOVQ AX, L_G0(SP)
	CMPQ AX, ng+32(FP)
	JLT chunk
done:
	VZEROUPPER
	RET

// next advances the block pointers by AX rows and loops.
next:
	SUBQ AX, L_ROWS(SP)
	MOVQ AX, CX
	IMULQ L_FSTRIDE(SP), CX
	ADDQ CX, L_XS(SP)
	ADDQ CX, L_XSUM(SP)
	MOVQ AX, CX
	IMULQ ostride+96(FP), CX
	ADDQ CX, L_OUT(SP)
	MOVQ qstride+8(FP), CX
	SHLQ $1, CX
	IMULQ AX, CX
	ADDQ CX, L_X8(SP)
	JMP blocks

block8:
	MOVQ L_OUT(SP), AX
	MOVQ ostride+96(FP), CX
	CMPQ L_G0(SP), $0
	JNE b8load
	VPXORD Z8, Z8, Z8
	VPXORD Z9, Z9, Z9
	VPXORD Z10, Z10, Z10
	VPXORD Z11, Z11, Z11
	VPXORD Z12, Z12, Z12
	VPXORD Z13, Z13, Z13
	VPXORD Z14, Z14, Z14
	VPXORD Z15, Z15, Z15
	JMP b8go
b8load:
	ACCIN(Z8)
	ACCIN(Z9)
	ACCIN(Z10)
	ACCIN(Z11)
	ACCIN(Z12)
	ACCIN(Z13)
	ACCIN(Z14)
	ACCIN(Z15)
b8go:
	BLOCKPTRS
b8loop:
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4
	VPXORD Z5, Z5, Z5
	VPXORD Z6, Z6, Z6
	VPXORD Z7, Z7, Z7
	DP8(0)
	DP8(1)
	DP8(2)
	DP8(3)
	DP8(4)
	DP8(5)
	DP8(6)
	DP8(7)
	DP8(8)
	DP8(9)
	DP8(10)
	DP8(11)
	DP8(12)
	DP8(13)
	DP8(14)
	DP8(15)
	VMOVUPS TSCALE(SI), Z18
	VMOVUPS TBIAS(SI), Z19
	FL((R11), (R10), Z0, Z8)
	FL((R11)(R12*1), (R10)(R12*1), Z1, Z9)
	FL((R11)(R12*2), (R10)(R12*2), Z2, Z10)
	FL((R11)(R9*1), (R10)(R9*1), Z3, Z11)
	FL((R11)(R12*4), (R10)(R12*4), Z4, Z12)
	FL((R8)(R12*2), (AX)(R12*2), Z5, Z13)
	FL((R8)(R9*1), (AX)(R9*1), Z6, Z14)
	FL((R8)(R12*4), (AX)(R12*4), Z7, Z15)
	ADVANCE
	DECQ CX
	JNE b8loop
	MOVQ L_OUT(SP), AX
	MOVQ ostride+96(FP), CX
	ACCOUT(Z8)
	ACCOUT(Z9)
	ACCOUT(Z10)
	ACCOUT(Z11)
	ACCOUT(Z12)
	ACCOUT(Z13)
	ACCOUT(Z14)
	ACCOUT(Z15)
	MOVQ $8, AX
	JMP next

block4:
	MOVQ L_OUT(SP), AX
	MOVQ ostride+96(FP), CX
	CMPQ L_G0(SP), $0
	JNE b4load
	VPXORD Z8, Z8, Z8
	VPXORD Z9, Z9, Z9
	VPXORD Z10, Z10, Z10
	VPXORD Z11, Z11, Z11
	JMP b4go
b4load:
	ACCIN(Z8)
	ACCIN(Z9)
	ACCIN(Z10)
	ACCIN(Z11)
b4go:
	BLOCKPTRS
b4loop:
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4
	VPXORD Z5, Z5, Z5
	VPXORD Z6, Z6, Z6
	VPXORD Z7, Z7, Z7
	DP4(0, Z0, Z1, Z2, Z3)
	DP4(1, Z4, Z5, Z6, Z7)
	DP4(2, Z0, Z1, Z2, Z3)
	DP4(3, Z4, Z5, Z6, Z7)
	DP4(4, Z0, Z1, Z2, Z3)
	DP4(5, Z4, Z5, Z6, Z7)
	DP4(6, Z0, Z1, Z2, Z3)
	DP4(7, Z4, Z5, Z6, Z7)
	DP4(8, Z0, Z1, Z2, Z3)
	DP4(9, Z4, Z5, Z6, Z7)
	DP4(10, Z0, Z1, Z2, Z3)
	DP4(11, Z4, Z5, Z6, Z7)
	DP4(12, Z0, Z1, Z2, Z3)
	DP4(13, Z4, Z5, Z6, Z7)
	DP4(14, Z0, Z1, Z2, Z3)
	DP4(15, Z4, Z5, Z6, Z7)
	VPADDD Z4, Z0, Z0
	VPADDD Z5, Z1, Z1
	VPADDD Z6, Z2, Z2
	VPADDD Z7, Z3, Z3
	VMOVUPS TSCALE(SI), Z18
	VMOVUPS TBIAS(SI), Z19
	FL((R11), (R10), Z0, Z8)
	FL((R11)(R12*1), (R10)(R12*1), Z1, Z9)
	FL((R11)(R12*2), (R10)(R12*2), Z2, Z10)
	FL((R11)(R9*1), (R10)(R9*1), Z3, Z11)
	ADVANCE
	DECQ CX
	JNE b4loop
	MOVQ L_OUT(SP), AX
	MOVQ ostride+96(FP), CX
	ACCOUT(Z8)
	ACCOUT(Z9)
	ACCOUT(Z10)
	ACCOUT(Z11)
	MOVQ $4, AX
	JMP next

block2:
	MOVQ L_OUT(SP), AX
	MOVQ ostride+96(FP), CX
	CMPQ L_G0(SP), $0
	JNE b2load
	VPXORD Z8, Z8, Z8
	VPXORD Z9, Z9, Z9
	JMP b2go
b2load:
	ACCIN(Z8)
	ACCIN(Z9)
b2go:
	BLOCKPTRS
b2loop:
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4
	VPXORD Z5, Z5, Z5
	VPXORD Z6, Z6, Z6
	VPXORD Z7, Z7, Z7
	DP2(0, Z0, Z1)
	DP2(1, Z2, Z3)
	DP2(2, Z4, Z5)
	DP2(3, Z6, Z7)
	DP2(4, Z0, Z1)
	DP2(5, Z2, Z3)
	DP2(6, Z4, Z5)
	DP2(7, Z6, Z7)
	DP2(8, Z0, Z1)
	DP2(9, Z2, Z3)
	DP2(10, Z4, Z5)
	DP2(11, Z6, Z7)
	DP2(12, Z0, Z1)
	DP2(13, Z2, Z3)
	DP2(14, Z4, Z5)
	DP2(15, Z6, Z7)
	VPADDD Z2, Z0, Z0
	VPADDD Z6, Z4, Z4
	VPADDD Z3, Z1, Z1
	VPADDD Z7, Z5, Z5
	VPADDD Z4, Z0, Z0
	VPADDD Z5, Z1, Z1
	VMOVUPS TSCALE(SI), Z18
	VMOVUPS TBIAS(SI), Z19
	FL((R11), (R10), Z0, Z8)
	FL((R11)(R12*1), (R10)(R12*1), Z1, Z9)
	ADVANCE
	DECQ CX
	JNE b2loop
	MOVQ L_OUT(SP), AX
	MOVQ ostride+96(FP), CX
	ACCOUT(Z8)
	ACCOUT(Z9)
	MOVQ $2, AX
	JMP next

block1:
	MOVQ L_OUT(SP), AX
	MOVQ ostride+96(FP), CX
	CMPQ L_G0(SP), $0
	JNE b1load
	VPXORD Z8, Z8, Z8
	JMP b1go
b1load:
	ACCIN(Z8)
b1go:
	BLOCKPTRS
b1loop:
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	DP1(0, Z0)
	DP1(1, Z1)
	DP1(2, Z2)
	DP1(3, Z3)
	DP1(4, Z0)
	DP1(5, Z1)
	DP1(6, Z2)
	DP1(7, Z3)
	DP1(8, Z0)
	DP1(9, Z1)
	DP1(10, Z2)
	DP1(11, Z3)
	DP1(12, Z0)
	DP1(13, Z1)
	DP1(14, Z2)
	DP1(15, Z3)
	VPADDD Z1, Z0, Z0
	VPADDD Z3, Z2, Z2
	VPADDD Z2, Z0, Z0
	VMOVUPS TSCALE(SI), Z18
	VMOVUPS TBIAS(SI), Z19
	FL((R11), (R10), Z0, Z8)
	ADVANCE
	DECQ CX
	JNE b1loop
	MOVQ L_OUT(SP), AX
	MOVQ ostride+96(FP), CX
	ACCOUT(Z8)
	MOVQ $1, AX
	JMP next
