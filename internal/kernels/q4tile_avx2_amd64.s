//go:build amd64

#include "textflag.h"
#include "prefetch_amd64.h"

// The AVX2 q4 tile kernel: q4TileVNNI's design (see q4tile_avx512_amd64.s)
// for 8 weight rows per tile, one per lane of a Y register. Without VNNI,
// VPMADDUBSW multiplies 8 rows' nibbles by four broadcast activation bytes
// into int16 pairs (at most 2·15·127 = 3810 each); eight of those add up in
// int16 without overflow (30480 < 32767), and VPMADDWD widens each half of
// the group to int32. The integer group sum is exact, so the results are
// those of the VNNI kernel and of dotQ4I8, bit for bit.

#define KC 8
#define TGROUP 576             // per group in the frame: 16 vectors, scales, biases
#define TSCALE 512
#define TBIAS 544

#define L_G0 0
#define L_KG 8
#define L_ROWS 16
#define L_X8 24
#define L_XS 32
#define L_XSUM 40
#define L_OUT 48
#define L_T 56
#define L_STAGE 64
#define L_FSTRIDE 72
#define L_WSRC 80
#define L_WSTR 88
#define L_SSRC 96
#define L_BSRC 104
#define L_SSTR 112
#define L_FULL 120             // 1 when every lane of out is stored
#define L_KMASK 128            // 32 bytes: lanes < kg
#define L_OMASK 160            // 32 bytes: lanes < nout
#define FRAME_ALIGN 192
#define STAGE_BYTES 4096
#define STAGE_SCALES 2048
#define STAGE_BIASES 2080
// Frame size 8960 = 192 + 64 + STAGE_BYTES + KC*TGROUP.

DATA q4t2c<>+0(SB)/8, $0x0f0f0f0f0f0f0f0f
DATA q4t2c<>+8(SB)/8, $0x0f0f0f0f0f0f0f0f
DATA q4t2c<>+16(SB)/8, $0x0f0f0f0f0f0f0f0f
DATA q4t2c<>+24(SB)/8, $0x0f0f0f0f0f0f0f0f
DATA q4t2c<>+32(SB)/8, $0x0001000100010001
DATA q4t2c<>+40(SB)/8, $0x0001000100010001
DATA q4t2c<>+48(SB)/8, $0x0001000100010001
DATA q4t2c<>+56(SB)/8, $0x0001000100010001
DATA q4t2c<>+64(SB)/4, $0
DATA q4t2c<>+68(SB)/4, $1
DATA q4t2c<>+72(SB)/4, $2
DATA q4t2c<>+76(SB)/4, $3
DATA q4t2c<>+80(SB)/4, $4
DATA q4t2c<>+84(SB)/4, $5
DATA q4t2c<>+88(SB)/4, $6
DATA q4t2c<>+92(SB)/4, $7
GLOBL q4t2c<>(SB), RODATA|NOPTR, $96

// The qword indices of the 512-bit decode kernel's last folding step
// (VPERMT2Q: 0-7 the first table, 8-15 the second).
DATA q4zfold<>+0(SB)/8, $0
DATA q4zfold<>+8(SB)/8, $1
DATA q4zfold<>+16(SB)/8, $8
DATA q4zfold<>+24(SB)/8, $9
DATA q4zfold<>+32(SB)/8, $4
DATA q4zfold<>+40(SB)/8, $5
DATA q4zfold<>+48(SB)/8, $12
DATA q4zfold<>+56(SB)/8, $13
DATA q4zfold<>+64(SB)/8, $2
DATA q4zfold<>+72(SB)/8, $3
DATA q4zfold<>+80(SB)/8, $10
DATA q4zfold<>+88(SB)/8, $11
DATA q4zfold<>+96(SB)/8, $6
DATA q4zfold<>+104(SB)/8, $7
DATA q4zfold<>+112(SB)/8, $14
DATA q4zfold<>+120(SB)/8, $15
GLOBL q4zfold<>(SB), RODATA|NOPTR, $128

#define NIBBLES q4t2c<>+0(SB)
#define ONES16 q4t2c<>+32(SB)
#define IOTA q4t2c<>+64(SB)

// Transposition of 8 rows × 8 dwords (rows at SI, SI+BX, SI+2BX, SI+DX,
// SI+4BX, R8, R8+BX, R8+2BX with DX = 3BX, R8 = SI+5BX) into Y8..Y15,
// vector j holding dword j of every row. T2LOADS loads only the lanes of
// the mask in Y15 (the chunk's groups), never a byte past them.
#define T2LOADW \
	VMOVDQU (SI), Y0 \
	VMOVDQU (SI)(BX*1), Y1 \
	VMOVDQU (SI)(BX*2), Y2 \
	VMOVDQU (SI)(DX*1), Y3 \
	VMOVDQU (SI)(BX*4), Y4 \
	VMOVDQU (R8), Y5 \
	VMOVDQU (R8)(BX*1), Y6 \
	VMOVDQU (R8)(BX*2), Y7

#define T2LOADS \
	VMOVDQU L_KMASK(SP), Y15 \
	VPMASKMOVD (SI), Y15, Y0 \
	VPMASKMOVD (SI)(BX*1), Y15, Y1 \
	VPMASKMOVD (SI)(BX*2), Y15, Y2 \
	VPMASKMOVD (SI)(DX*1), Y15, Y3 \
	VPMASKMOVD (SI)(BX*4), Y15, Y4 \
	VPMASKMOVD (R8), Y15, Y5 \
	VPMASKMOVD (R8)(BX*1), Y15, Y6 \
	VPMASKMOVD (R8)(BX*2), Y15, Y7

// The classic 8×8 transpose: dword, then qword interleaves within 128-bit
// lanes, then VPERM2I128 across them.
#define T2NET \
	VPUNPCKLDQ Y1, Y0, Y8 \
	VPUNPCKHDQ Y1, Y0, Y9 \
	VPUNPCKLDQ Y3, Y2, Y10 \
	VPUNPCKHDQ Y3, Y2, Y11 \
	VPUNPCKLDQ Y5, Y4, Y12 \
	VPUNPCKHDQ Y5, Y4, Y13 \
	VPUNPCKLDQ Y7, Y6, Y14 \
	VPUNPCKHDQ Y7, Y6, Y15 \
	VPUNPCKLQDQ Y10, Y8, Y0 \
	VPUNPCKHQDQ Y10, Y8, Y1 \
	VPUNPCKLQDQ Y11, Y9, Y2 \
	VPUNPCKHQDQ Y11, Y9, Y3 \
	VPUNPCKLQDQ Y14, Y12, Y4 \
	VPUNPCKHQDQ Y14, Y12, Y5 \
	VPUNPCKLQDQ Y15, Y13, Y6 \
	VPUNPCKHQDQ Y15, Y13, Y7 \
	VPERM2I128 $0x20, Y4, Y0, Y8 \
	VPERM2I128 $0x31, Y4, Y0, Y12 \
	VPERM2I128 $0x20, Y5, Y1, Y9 \
	VPERM2I128 $0x31, Y5, Y1, Y13 \
	VPERM2I128 $0x20, Y6, Y2, Y10 \
	VPERM2I128 $0x31, Y6, Y2, Y14 \
	VPERM2I128 $0x20, Y7, Y3, Y11 \
	VPERM2I128 $0x31, Y7, Y3, Y15

// T4NET transposes at most 4 dwords per row, loaded by T4LOADH (q4Rows)
// into Y0..Y3 with row r in the low and row r+4 in the high 128 bits of
// Y(r), into Y8..Y11: dword and qword interleaves within the lanes.
#define T4NET \
	VPUNPCKLDQ Y1, Y0, Y4 \
	VPUNPCKHDQ Y1, Y0, Y5 \
	VPUNPCKLDQ Y3, Y2, Y6 \
	VPUNPCKHDQ Y3, Y2, Y7 \
	VPUNPCKLQDQ Y6, Y4, Y8 \
	VPUNPCKHQDQ Y6, Y4, Y9 \
	VPUNPCKLQDQ Y7, Y5, Y10 \
	VPUNPCKHQDQ Y7, Y5, Y11

#define T2ROWS \
	LEAQ (BX)(BX*2), DX \
	LEAQ (SI)(BX*4), R8 \
	ADDQ BX, R8

#define T2STOREF(off) \
	VMOVDQU Y8, (off+0*TGROUP)(DI) \
	VMOVDQU Y9, (off+1*TGROUP)(DI) \
	VMOVDQU Y10, (off+2*TGROUP)(DI) \
	VMOVDQU Y11, (off+3*TGROUP)(DI) \
	VMOVDQU Y12, (off+4*TGROUP)(DI) \
	VMOVDQU Y13, (off+5*TGROUP)(DI) \
	VMOVDQU Y14, (off+6*TGROUP)(DI) \
	VMOVDQU Y15, (off+7*TGROUP)(DI)

// Weight vector j: low nibbles to vector j, high nibbles to vector 8+j
// (Y0 holds the nibble mask).
#define T2STORE(V, j) \
	VPAND Y0, V, Y1 \
	VMOVDQU Y1, (j*32)(DI) \
	VPSRLW $4, V, V \
	VPAND Y0, V, V \
	VMOVDQU V, ((8+j)*32)(DI)

// Integer part for 4 activation rows (x8 rows at DI, DI+BX, DI+2BX, DI+DX):
// A4F starts the int16 sums of a half group in Y0..Y3, A4N adds to them.
#define A4F(m) \
	VMOVDQU (m*32)(SI), Y12 \
	VPBROADCASTD (m*4)(DI), Y13 \
	VPMADDUBSW Y13, Y12, Y0 \
	VPBROADCASTD (m*4)(DI)(BX*1), Y14 \
	VPMADDUBSW Y14, Y12, Y1 \
	VPBROADCASTD (m*4)(DI)(BX*2), Y13 \
	VPMADDUBSW Y13, Y12, Y2 \
	VPBROADCASTD (m*4)(DI)(DX*1), Y14 \
	VPMADDUBSW Y14, Y12, Y3

#define A4N(m) \
	VMOVDQU (m*32)(SI), Y12 \
	VPBROADCASTD (m*4)(DI), Y13 \
	VPMADDUBSW Y13, Y12, Y13 \
	VPADDW Y13, Y0, Y0 \
	VPBROADCASTD (m*4)(DI)(BX*1), Y14 \
	VPMADDUBSW Y14, Y12, Y14 \
	VPADDW Y14, Y1, Y1 \
	VPBROADCASTD (m*4)(DI)(BX*2), Y13 \
	VPMADDUBSW Y13, Y12, Y13 \
	VPADDW Y13, Y2, Y2 \
	VPBROADCASTD (m*4)(DI)(DX*1), Y14 \
	VPMADDUBSW Y14, Y12, Y14 \
	VPADDW Y14, Y3, Y3

#define A2F(m) \
	VMOVDQU (m*32)(SI), Y12 \
	VPBROADCASTD (m*4)(DI), Y13 \
	VPMADDUBSW Y13, Y12, Y0 \
	VPBROADCASTD (m*4)(DI)(BX*1), Y14 \
	VPMADDUBSW Y14, Y12, Y1

#define A2N(m) \
	VMOVDQU (m*32)(SI), Y12 \
	VPBROADCASTD (m*4)(DI), Y13 \
	VPMADDUBSW Y13, Y12, Y13 \
	VPADDW Y13, Y0, Y0 \
	VPBROADCASTD (m*4)(DI)(BX*1), Y14 \
	VPMADDUBSW Y14, Y12, Y14 \
	VPADDW Y14, Y1, Y1

// One row: two int16 chains (even and odd m) to halve the add latency.
#define A1F(m) \
	VMOVDQU (m*32)(SI), Y12 \
	VPBROADCASTD (m*4)(DI), Y13 \
	VPMADDUBSW Y13, Y12, Y0 \
	VMOVDQU ((m+1)*32)(SI), Y12 \
	VPBROADCASTD ((m+1)*4)(DI), Y14 \
	VPMADDUBSW Y14, Y12, Y1

#define A1N(m) \
	VMOVDQU (m*32)(SI), Y12 \
	VPBROADCASTD (m*4)(DI), Y13 \
	VPMADDUBSW Y13, Y12, Y13 \
	VPADDW Y13, Y0, Y0 \
	VMOVDQU ((m+1)*32)(SI), Y12 \
	VPBROADCASTD ((m+1)*4)(DI), Y14 \
	VPMADDUBSW Y14, Y12, Y14 \
	VPADDW Y14, Y1, Y1

// Widen the int16 sums of the first half group into the int32 sums I, of
// the second half adding to them.
#define W1(A, I) \
	VPMADDWD ONES16, A, I

#define W2(A, I) \
	VPMADDWD ONES16, A, A \
	VPADDD A, I, I

// Float part of one group for one row (I: 8 exact integer sums):
//   acc += s·(scale·xs) + bias·xsum
#define F2(xsa, xsuma, I, ACC) \
	VCVTDQ2PS I, I \
	VBROADCASTSS xsa, Y13 \
	VMULPS TSCALE(SI), Y13, Y13 \
	VMULPS Y13, I, I \
	VBROADCASTSS xsuma, Y14 \
	VMULPS TBIAS(SI), Y14, Y14 \
	VADDPS Y14, I, I \
	VADDPS I, ACC, ACC

// Accumulators in and out: AX walks out's rows (CX the stride); a partial
// tile moves only the lanes of the mask in Y15.
#define ACC2IN(ACC) \
	VMASKMOVPS (AX), Y15, ACC \
	ADDQ CX, AX

#define ACC2OUT(ACC) \
	VMASKMOVPS ACC, Y15, (AX) \
	ADDQ CX, AX

#define ACC2OUTF(ACC) \
	VMOVUPS ACC, (AX) \
	ADDQ CX, AX

// Pointers of a block of rows: DI x8, R11 xs, R10 xsum; BX = C, DX = 3C,
// R12 = fstride, R9 = 3·fstride.
#define BLOCK2PTRS \
	MOVQ L_X8(SP), DI \
	MOVQ L_XS(SP), R11 \
	MOVQ L_XSUM(SP), R10 \
	MOVQ qstride+8(FP), BX \
	SHLQ $1, BX \
	LEAQ (BX)(BX*2), DX \
	MOVQ L_FSTRIDE(SP), R12 \
	LEAQ (R12)(R12*2), R9 \
	MOVQ L_T(SP), SI \
	MOVQ L_KG(SP), CX

#define ADVANCE2 \
	ADDQ $TGROUP, SI \
	ADDQ $64, DI \
	ADDQ $4, R11 \
	ADDQ $4, R10

// Accumulators at the start of a block of n rows: zero in the first chunk,
// else what the previous chunk left in out.
#define BLOCK2IN(lbl) \
	MOVQ L_OUT(SP), AX \
	MOVQ ostride+96(FP), CX \
	VMOVDQU L_OMASK(SP), Y15 \
	CMPQ L_G0(SP), $0 \
	JNE lbl

// func q4TileAVX2(q *byte, qstride int, scales, biases *float32, ng, nrows, nout int, x8 *int8, xs, xsum *float32, nb int, out *float32, ostride int)
//
// q4TileVNNI's contract for a tile of 8 rows (nrows and nout at most 8).
TEXT ·q4TileAVX2(SB), 0, $8960-104
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
	// The store mask: lanes < nout.
	MOVQ nout+48(FP), AX
	MOVQ $1, L_FULL(SP)
	CMPQ AX, $8
	JEQ full
	MOVQ $0, L_FULL(SP)
full:
	VMOVQ AX, X0
	VPBROADCASTD X0, Y0
	VPCMPGTD IOTA, Y0, Y0
	VMOVDQU Y0, L_OMASK(SP)
	MOVQ $0, L_G0(SP)

chunk:
	MOVQ ng+32(FP), AX
	SUBQ L_G0(SP), AX
	CMPQ AX, $KC
	JLE kgset
	MOVQ $KC, AX
kgset:
	MOVQ AX, L_KG(SP)
	VMOVQ AX, X0
	VPBROADCASTD X0, Y0
	VPCMPGTD IOTA, Y0, Y0
	VMOVDQU Y0, L_KMASK(SP)     // the chunk's groups

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
	CMPQ nrows+40(FP), $8
	JGE transpose
	// A partial tile: stage the rows, the missing ones repeating row
	// nrows-1.
	MOVQ nrows+40(FP), R12
	DECQ R12
	XORQ CX, CX
	MOVQ L_STAGE(SP), DI
	VMOVDQU L_KMASK(SP), Y15
stagerow:
	MOVQ CX, AX
	CMPQ AX, R12
	CMOVQGT R12, AX
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
	VPMASKMOVD (AX)(R11*1), Y15, Y0
	VMOVDQU Y0, (STAGE_SCALES)(DI)
	MOVQ L_BSRC(SP), AX
	VPMASKMOVD (AX)(R11*1), Y15, Y0
	VMOVDQU Y0, (STAGE_BIASES)(DI)
	ADDQ $(KC*32), DI
	INCQ CX
	CMPQ CX, $8
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
	MOVQ nrows+40(FP), AX
	VMOVQ AX, X0
	VPBROADCASTD X0, Y0
	VPCMPGTD IOTA, Y0, Y0
	MOVQ scales+16(FP), SI
	VPMASKMOVD (SI), Y0, Y1
	VMOVDQU Y1, TSCALE(DI)
	MOVQ biases+24(FP), SI
	VPMASKMOVD (SI), Y0, Y1
	VMOVDQU Y1, TBIAS(DI)
	JMP tweights
tscales:
	MOVQ L_SSRC(SP), SI
	MOVQ L_SSTR(SP), BX
	T2ROWS
	T2LOADS
	T2NET
	T2STOREF(TSCALE)
	MOVQ L_BSRC(SP), SI
	T2ROWS
	T2LOADS
	T2NET
	T2STOREF(TBIAS)
tweights:
	MOVQ L_WSRC(SP), SI
	MOVQ L_WSTR(SP), BX
	T2ROWS
	MOVQ L_KG(SP), CX
tgroup:
	T2LOADW
	T2NET
	VMOVDQU NIBBLES, Y0
	T2STORE(Y8, 0)
	T2STORE(Y9, 1)
	T2STORE(Y10, 2)
	T2STORE(Y11, 3)
	T2STORE(Y12, 4)
	T2STORE(Y13, 5)
	T2STORE(Y14, 6)
	T2STORE(Y15, 7)
	ADDQ $32, SI
	ADDQ $32, R8
	ADDQ $TGROUP, DI
	DECQ CX
	JNE tgroup

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
	CMPQ AX, $4
	JGE block4
	CMPQ AX, $2
	JGE block2
	CMPQ AX, $1
	JGE block1
	MOVQ L_G0(SP), AX
	ADDQ $KC, AX
	MOVQ AX, L_G0(SP)
	CMPQ AX, ng+32(FP)
	JLT chunk
done:
	VZEROUPPER
	RET

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

block4:
	BLOCK2IN(b4load)
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11
	JMP b4go
b4load:
	ACC2IN(Y8)
	ACC2IN(Y9)
	ACC2IN(Y10)
	ACC2IN(Y11)
b4go:
	BLOCK2PTRS
b4loop:
	A4F(0)
	A4N(1)
	A4N(2)
	A4N(3)
	A4N(4)
	A4N(5)
	A4N(6)
	A4N(7)
	W1(Y0, Y4)
	W1(Y1, Y5)
	W1(Y2, Y6)
	W1(Y3, Y7)
	A4F(8)
	A4N(9)
	A4N(10)
	A4N(11)
	A4N(12)
	A4N(13)
	A4N(14)
	A4N(15)
	W2(Y0, Y4)
	W2(Y1, Y5)
	W2(Y2, Y6)
	W2(Y3, Y7)
	F2((R11), (R10), Y4, Y8)
	F2((R11)(R12*1), (R10)(R12*1), Y5, Y9)
	F2((R11)(R12*2), (R10)(R12*2), Y6, Y10)
	F2((R11)(R9*1), (R10)(R9*1), Y7, Y11)
	ADVANCE2
	DECQ CX
	JNE b4loop
	MOVQ L_OUT(SP), AX
	MOVQ ostride+96(FP), CX
	CMPQ L_FULL(SP), $0
	JEQ b4part
	ACC2OUTF(Y8)
	ACC2OUTF(Y9)
	ACC2OUTF(Y10)
	ACC2OUTF(Y11)
	MOVQ $4, AX
	JMP next
b4part:
	ACC2OUT(Y8)
	ACC2OUT(Y9)
	ACC2OUT(Y10)
	ACC2OUT(Y11)
	MOVQ $4, AX
	JMP next

block2:
	BLOCK2IN(b2load)
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	JMP b2go
b2load:
	ACC2IN(Y8)
	ACC2IN(Y9)
b2go:
	BLOCK2PTRS
b2loop:
	A2F(0)
	A2N(1)
	A2N(2)
	A2N(3)
	A2N(4)
	A2N(5)
	A2N(6)
	A2N(7)
	W1(Y0, Y4)
	W1(Y1, Y5)
	A2F(8)
	A2N(9)
	A2N(10)
	A2N(11)
	A2N(12)
	A2N(13)
	A2N(14)
	A2N(15)
	W2(Y0, Y4)
	W2(Y1, Y5)
	F2((R11), (R10), Y4, Y8)
	F2((R11)(R12*1), (R10)(R12*1), Y5, Y9)
	ADVANCE2
	DECQ CX
	JNE b2loop
	MOVQ L_OUT(SP), AX
	MOVQ ostride+96(FP), CX
	CMPQ L_FULL(SP), $0
	JEQ b2part
	ACC2OUTF(Y8)
	ACC2OUTF(Y9)
	MOVQ $2, AX
	JMP next
b2part:
	ACC2OUT(Y8)
	ACC2OUT(Y9)
	MOVQ $2, AX
	JMP next

block1:
	BLOCK2IN(b1load)
	VXORPS Y8, Y8, Y8
	JMP b1go
b1load:
	ACC2IN(Y8)
b1go:
	BLOCK2PTRS
b1loop:
	A1F(0)
	A1N(2)
	A1N(4)
	A1N(6)
	VPADDW Y1, Y0, Y0
	W1(Y0, Y4)
	A1F(8)
	A1N(10)
	A1N(12)
	A1N(14)
	VPADDW Y1, Y0, Y0
	W2(Y0, Y4)
	F2((R11), (R10), Y4, Y8)
	ADVANCE2
	DECQ CX
	JNE b1loop
	MOVQ L_OUT(SP), AX
	MOVQ ostride+96(FP), CX
	CMPQ L_FULL(SP), $0
	JEQ b1part
	ACC2OUTF(Y8)
	MOVQ $1, AX
	JMP next
b1part:
	ACC2OUT(Y8)
	MOVQ $1, AX
	JMP next

// The decode kernel: 8 weight rows against one activation row, with no
// transposition of the weights. Each row's group is unpacked and dotted
// with the activations in place (8 int32 partial sums per row); a
// transposing reduction folds the 8 rows' partial sums into one vector of
// their exact group sums, one row per lane, and the float part runs on
// that vector as in the tile kernels. Only the scales and biases are transposed (T2NET, per chunk
// of 8 groups), the weights being what a decode step cannot afford to
// rearrange: each is used once. The scales and biases are the packed
// format's halves, widened (VCVTPH2PS, exact) as the transposition loads
// them.

// T2LOADS for halves, and T4NET's loads: each row's kg halves (under the
// mask of the ceil(kg/2) dwords that hold them, in L_KMASK) widened to
// floats, so that T2NET and T4NET transpose floats as in the tile kernels.
// HLOADS loads the 8 rows' masked dwords into X0..X7.
#define HLOADS \
	VMOVDQU L_KMASK(SP), X15 \
	VPMASKMOVD (SI), X15, X0 \
	VPMASKMOVD (SI)(BX*1), X15, X1 \
	VPMASKMOVD (SI)(BX*2), X15, X2 \
	VPMASKMOVD (SI)(DX*1), X15, X3 \
	VPMASKMOVD (SI)(BX*4), X15, X4 \
	VPMASKMOVD (R8), X15, X5 \
	VPMASKMOVD (R8)(BX*1), X15, X6 \
	VPMASKMOVD (R8)(BX*2), X15, X7

#define T2LOADH \
	HLOADS \
	VCVTPH2PS X0, Y0 \
	VCVTPH2PS X1, Y1 \
	VCVTPH2PS X2, Y2 \
	VCVTPH2PS X3, Y3 \
	VCVTPH2PS X4, Y4 \
	VCVTPH2PS X5, Y5 \
	VCVTPH2PS X6, Y6 \
	VCVTPH2PS X7, Y7

#define T4LOADH \
	HLOADS \
	VCVTPH2PS X0, X0 \
	VCVTPH2PS X1, X1 \
	VCVTPH2PS X2, X2 \
	VCVTPH2PS X3, X3 \
	VCVTPH2PS X4, X4 \
	VCVTPH2PS X5, X5 \
	VCVTPH2PS X6, X6 \
	VCVTPH2PS X7, X7 \
	VINSERTI128 $1, X4, Y0, Y0 \
	VINSERTI128 $1, X5, Y1, Y1 \
	VINSERTI128 $1, X6, Y2, Y2 \
	VINSERTI128 $1, X7, Y3, Y3

// One row's group in AVX2: Y9 low nibbles, Y8 high, times the activations
// at DI; I receives 8 int32 partial sums. Y10 holds the nibble mask.
#define RDOT2(A, I) \
	VMOVDQU A, Y8 \
	VPAND Y10, Y8, Y9 \
	VPSRLW $4, Y8, Y8 \
	VPAND Y10, Y8, Y8 \
	VPMADDUBSW (DI), Y9, Y9 \
	VPMADDUBSW 32(DI), Y8, Y8 \
	VPADDW Y9, Y8, Y8 \
	VPMADDWD ONES16, Y8, I

// The same with VNNI (EVEX-encoded on Y registers, AVX512VL).
#define RDOTV(A, I) \
	VMOVDQU A, Y8 \
	VPAND Y10, Y8, Y9 \
	VPSRLW $4, Y8, Y8 \
	VPAND Y10, Y8, Y8 \
	VPXOR I, I, I \
	VPDPBUSD (DI), Y9, I \
	VPDPBUSD 32(DI), Y8, I

// Qword k of a tiled group's 8 rows against the activations' qword k
// broadcast (Mat.Tiled: row r's bytes 8k..8k+7 at k·64 + r·8 from the
// group's start, so that row r's partial sums stay in its own lanes and
// need no fold across lanes). TQZ: all 8 rows on a Z register (VNNI),
// the group at P (a pair's second tile's at R8); L and H hold the low and
// high nibbles' activations, Z24 the nibble mask. The low nibbles' sums go
// to I, the high nibbles', taken in place (16 times theirs), to IH, for
// TQZFOLD.
#define TQZ(P, K, L, H, I, IH) \
	VMOVDQU64 (K*64)(P), Z8 \
	VPANDD Z24, Z8, Z9 \
	VPANDND Z8, Z24, Z8 \
	VPDPBUSD L, Z9, I \
	VPDPBUSD H, Z8, IH

// TQZ4 is a tile's group at P: its qwords 0 and 2 into the chains I0
// (low nibbles) and H0 (high), 1 and 3 into I1 and H1 (the same two
// registers again where two chains suffice), against TQZCAST's
// broadcasts.
#define TQZ4(P, I0, H0, I1, H1) \
	TQZ(P, 0, Z16, Z20, I0, H0) \
	TQZ(P, 1, Z17, Z21, I1, H1) \
	TQZ(P, 2, Z18, Z22, I0, H0) \
	TQZ(P, 3, Z19, Z23, I1, H1)

// RFLOAT is a group's float part for one tile: Y (its 8 rows' exact
// integer sums) times scale·xs, plus bias·xsum, added to ACC; the
// scales at S and biases at B are widened (q4Rows's transposes), xs and
// xsum broadcast in Y14 and Y15. Y12 and Y13 are scratch.
#define RFLOAT(Y, S, B, ACC) \
	VCVTDQ2PS Y, Y \
	VMULPS S, Y14, Y12 \
	VMULPS Y12, Y, Y \
	VMULPS B, Y15, Y13 \
	VADDPS Y13, Y, Y \
	VADDPS Y, ACC, ACC

// TQZCAST broadcasts the activations' 8 qwords of a group (at DI) into
// Z16-Z23, TQZ's L (qwords 0-3) and H (4-7) operands.
#define TQZCAST \
	VPBROADCASTQ 0(DI), Z16 \
	VPBROADCASTQ 8(DI), Z17 \
	VPBROADCASTQ 16(DI), Z18 \
	VPBROADCASTQ 24(DI), Z19 \
	VPBROADCASTQ 32(DI), Z20 \
	VPBROADCASTQ 40(DI), Z21 \
	VPBROADCASTQ 48(DI), Z22 \
	VPBROADCASTQ 56(DI), Z23

// TQZFOLD adds a tile's sums of the high nibbles H (16 times theirs:
// TQZ leaves the nibbles in place, saving a shift a line; the shift right
// by 4 is exact, every term being a multiple of 16) to those of the low
// nibbles A (row r in dwords 2r and 2r+1), then each row's two dwords,
// row r into lane r of Y.
#define TQZFOLD(A, H, Y) \
	VPSRAD $4, H, H \
	VPADDD H, A, A \
	VPSRLQ $32, A, H \
	VPADDD H, A, A \
	VPMOVQD A, Y

// TNEXT moves the tiled paths' pointers to the next group of the tile
// and counts it off the chunk's (AX), setting Z when none is left.
#define TNEXT \
	ADDQ $256, SI \
	ADDQ $64, DI \
	ADDQ $4, R11 \
	ADDQ $4, R10 \
	ADDQ $64, R9 \
	DECQ AX

// TLOOP ends a step of a tiled path that loops over the chunk's groups
// itself, from lbl, one taken branch a group: the float part of the
// group's sums in Y1, then the next group, prefetching as PF4 does (from
// R12, which rstep sets by the mode).
#define TLOOP(lbl) \
	VBROADCASTSS (R11), Y14 \
	VBROADCASTSS (R10), Y15 \
	RFLOAT(Y1, (R9), 32(R9), Y11) \
	TNEXT \
	JEQ rnext \
	PF4 \
	JMP lbl

// TQV: rows 0-3 (O = 0) or 4-7 (O = 32) on a Y register (VNNI; AVX512VL).
#define TQV(K, O, L, H, I) \
	VMOVDQU (K*64+O)(SI), Y8 \
	VPAND Y10, Y8, Y9 \
	VPSRLW $4, Y8, Y8 \
	VPAND Y10, Y8, Y8 \
	VPDPBUSD L, Y9, I \
	VPDPBUSD H, Y8, I

// TQA: the same in AVX2, the activations in Y12 (low nibbles) and Y13.
#define TQA(K, O, I) \
	VMOVDQU (K*64+O)(SI), Y8 \
	VPAND Y10, Y8, Y9 \
	VPSRLW $4, Y8, Y8 \
	VPAND Y10, Y8, Y8 \
	VPMADDUBSW Y12, Y9, Y9 \
	VPMADDUBSW Y13, Y8, Y8 \
	VPADDW Y9, Y8, Y8 \
	VPMADDWD ONES16, Y8, Y8 \
	VPADDD Y8, I, I

// TQAK: qword K of all 8 rows in AVX2, rows 0-3 into Y0, 4-7 into Y2.
#define TQAK(K) \
	VPBROADCASTQ (K*8)(DI), Y12 \
	VPBROADCASTQ (32+K*8)(DI), Y13 \
	TQA(K, 0, Y0) \
	TQA(K, 32, Y2)

// TQFOLD: rows 0-3's sums in the even dwords of A's qwords, after adding
// each qword's two dwords, and rows 4-7's in B's, to lane r of Y1.
#define TQFOLD(A, B) \
	VPSRLQ $32, A, Y8 \
	VPADDD Y8, A, A \
	VPSRLQ $32, B, Y9 \
	VPADDD Y9, B, B \
	VSHUFPS $0x88, B, A, Y1 \
	VPERMQ $0xD8, Y1, Y1

// Rows at SI, SI+BX, SI+2BX, SI+DX, SI+4BX, R8, R8+BX, R8+2BX, loaded
// last row first. Each row sums into its own register, so the order
// changes no result, but it decides what the hardware prefetchers learn
// from the 8 loads a group: in ascending order, rows of 320 to 448 bytes
// (down projections of 640 to 896 columns, Qwen3-30B-A3B's 768 among
// them) streamed from memory at 0.62-0.71 of plain reads on one thread
// of a 2-core Zen 4, where rows of 192, 256, 512 bytes and more reached
// 0.73-0.93; in descending order 0.72-0.83 (640 and 768 columns) and
// 0.94-0.97 (896), the others level or ahead (BenchmarkQ4DecodeShare's
// "-rows" cases, builds alternating; VPDPBUSD, and without it 768
// columns 0.73-0.81 against 0.62-0.65). The 512-bit path (ZDOT) keeps
// ascending order: reversed there, on the same machine, 512 columns
// lost what 640 and 768 gained.
#define RDOT8(DOT) \
	DOT((R8)(BX*2), Y7) \
	DOT((R8)(BX*1), Y6) \
	DOT((R8), Y5) \
	DOT((SI)(BX*4), Y4) \
	DOT((SI)(DX*1), Y3) \
	DOT((SI)(BX*2), Y2) \
	DOT((SI)(BX*1), Y1) \
	DOT((SI), Y0)

// PF4 prefetches 4 lines from R12 on, the bytes of a later tile (the
// next, or PFMIN's distance on) that correspond to one group of this one:
// that tile lies after this one, so it is read sequentially while this
// tile computes, and its lines are in flight long before the 8
// interleaved row streams reach them (the hardware prefetchers follow 8
// streams 1 KB apart poorly).
#define PF4 \
	PF4LINES(R12) \
	ADDQ $256, R12

// The same for a pair of groups on Z registers (VNNI; AVX-512 F, BW):
// 64 bytes of a row (groups g and g+1) against Z12 (the activations of
// the low nibbles, g's then g+1's) and Z13 (of the high nibbles); I
// receives g's 8 partial sums in its low half, g+1's in its high half.
// Z10 holds the nibble mask.
#define ZDOT(A, I) \
	VPANDD A, Z10, Z9 \
	VPSRLW $4, A, Z8 \
	VPANDD Z10, Z8, Z8 \
	VPXORD I, I, I \
	VPDPBUSD Z12, Z9, I \
	VPDPBUSD Z13, Z8, I

// PF8 is PF4 for a pair of groups.
#define PF8 \
	PF8LINES(R12) \
	ADDQ $512, R12

#define L_RACC 0               // the tile's accumulators while T2NET runs
#define L_RG0 32
#define L_RKG 40
#define L_RB 48                // the tile's first bias
#define L_RTILES 56            // tiles left
#define L_RZ 64                // 1: pairs of groups on Z registers
#define L_RQG 72               // bytes from a row's group to its next
#define L_RPAIR 80             // 1: each step takes a tile of the pair's rows too
#define L_RPASS 81             // the chunk's scales being widened: 0 the first tile's, 1 the second's
#define L_RPOFF 88             // the pair's rows from the first rows: weights' bytes,
#define L_RSOFF 96             // scales' bytes,
#define L_RBOFF 104            // biases' bytes,
#define L_ROOFF 112            // and out's bytes
#define L_RPFQ 120             // the software prefetch's distance: weights' bytes,
#define L_RPFS 160             // scales' (and biases') bytes
// PFMIN is the software prefetch's distance ahead of the tile being
// computed: rounded up to whole tiles for tiles smaller than it, exactly
// PFMIN for larger ones (the tiles of a matrix are one stream, so the
// prefetch may reach into the middle of the next). A tile of 512 columns
// (2 KB) is read too soon after its prefetch for the memory's latency:
// down projections of 512 columns (Qwen3.5-35B-A3B's experts) ran 9-15%
// faster from memory at 8 KB ahead than one tile ahead (one thread; 8-12%
// on two). Farther is worse for large tiles: a whole tile ahead, a matrix
// of 4096 columns (16 KB tiles) streamed at 0.55-0.60 of plain reads on
// one thread of a 2-core Zen 4, 0.67-0.72 at 8 KB and 0.74-0.78 at 4 KB;
// 2048 columns (8 KB tiles) at 0.80-0.86 a tile ahead and 0.85-0.88 at
// 4 KB, and 2 and 3 KB tiles at 0.86-0.90 rounded up from 8 KB against
// 0.88-0.92 from 4 KB (BenchmarkQ4DecodeShare, alternating builds; the
// 512-bit variant gained alike in BenchmarkQ4DecodeDRAM's whole1).
// Row-major rows are prefetched in whole groups of 8 rows: there the
// prefetch walks the next group's 8 rows (8·qstride bytes) as one
// sequence while the kernel reads 8 streams a row apart, so that a
// distance short of a whole group would reach rows the kernel is already
// reading. Rounded up from 4 KB rather than 8, the down projections of
// 512 columns (2 KB groups) streamed at 0.83-0.84 of plain reads against
// 0.77-0.80 (one thread, BenchmarkQ4DecodeShare's "-rows" cases), and
// at 16 KB 0.65-0.66.
#define PFMIN 4096
// PFFAR is how far ahead of the tile being computed the kernel touches
// each 4 KB page of its weights (a line, PREFETCHT2), so that the page's
// address translation and the hardware prefetcher's start on it are
// under way long before the loads reach it. A decode reaches most of its
// experts' pages for the first time in tokens, and a page first reached
// costs it: on the 2-core Zen 5 VM a MoE step took 1.2-1.6x as long on
// the experts the router chose as on experts used a few layers before,
// and reading a byte of every 4 KB of them first made the step 6-12%
// faster (every 64 KB: no faster). In one process, decode steps with it
// and without it in turn, the qwen3.5-35b-a3b synth's steps ran
// 1.034-1.060x as fast with it (four runs), qwen3-30b-a3b's 1.061x; on
// matrices drawn from 1 GiB, which pay nothing for first touches, a
// line of two pages a tile moved 0.98-1.04x.
#define PFFAR 65536
// The second tile's widened scales and biases lie RST2 bytes past the
// first's (L_RST's), in the frame the tiled path leaves unused (L_XSX);
// a multiple of 64, so that both are aligned alike.
#define RST2 576
#define L_RST 192              // [KC] × (8 scales, 8 biases), aligned
#define ZNG 128                // the most groups the Z path takes (8192 columns)
#define L_XSX 768              // [ZNG] × 8 copies of xs[g]
#define L_XSUMX 4864           // [ZNG] × 8 copies of xsum[g]
// Frame size 8960 = L_XSUMX + ZNG*32; L_RST + 64 + KC*64 = 768;
// L_KMASK (T2LOADH) lies below L_RST.

// POFF stores in the frame's slot how far the pair's pointer (the q4Pair
// at BX, field at byte k) lies from the first rows' argument arg.
#define POFF(k, arg, slot) \
	MOVQ k(BX), DX \
	SUBQ arg, DX \
	MOVQ DX, slot(SP)

// func q4RowsAsm(q *byte, qstride int, scales, biases *uint16, ng, n int, x8 *int8, xs, xsum *float32, out *float32, mode uint8, room *[]float32, pair *q4Pair)
//
// n (a multiple of 8) consecutive weight rows from q (qstride bytes
// apart; ng groups, their scales and biases halves) against one activation row; out[i] receives row i's
// result, dotQ4I8's bit for bit. mode's bits (q4RowsVNNI, q4RowsPrefetch
// and q4RowsZMM in q4tile.go): 1 VPDPBUSD for the integer part, else
// VPMADDUBSW; 4 software prefetch of a later tile (PFMIN); 8 (with 1 and 4) two
// groups at a time on Z registers, for at most ZNG groups (more take the
// Y path); 16 the tiled layout (Mat.Tiled): a tile's group g at g·256
// bytes from its start, bytes 8k..8k+7 of its row r at k·64 + r·8 in it,
// on Z registers with 8 (for any number of groups), qstride still the
// bytes of a row, so that a tile is 8·qstride bytes in either layout.
//
// A pair (non-nil, with mode's bits 16, 8 and 4) names n more rows, of
// the same shape, to compute in the same pass, a tile of each a step:
// two streams of loads in flight, where one leaves the memory waiting.
TEXT ·q4RowsAsm(SB), 0, $8960-104
	MOVQ ng+32(FP), AX
	TESTQ AX, AX
	JEQ rdone
	MOVQ n+40(FP), AX
	SHRQ $3, AX
	JEQ rdone
	MOVQ AX, L_RTILES(SP)
	MOVB $0, L_RZ(SP)
	MOVQ $32, L_RQG(SP)
	MOVB $0, L_RPAIR(SP)
	MOVQ pair+96(FP), BX
	TESTQ BX, BX
	JEQ rnopair
	MOVB $1, L_RPAIR(SP)
	POFF(0, q+0(FP), L_RPOFF)
	POFF(8, scales+16(FP), L_RSOFF)
	POFF(16, biases+24(FP), L_RBOFF)
	POFF(24, out+72(FP), L_ROOFF)
rnopair:
	TESTB $16, mode+80(FP)
	JEQ rflat
	// Tiled rows: a tile's groups one after another, 256 bytes each.
	MOVQ $256, L_RQG(SP)
	TESTB $8, mode+80(FP)
	JEQ rzoff
	VBROADCASTI64X4 NIBBLES, Z24
	JMP rzoff
rflat:
	TESTB $8, mode+80(FP)
	JEQ rzoff
	MOVQ ng+32(FP), AX
	CMPQ AX, $ZNG
	JGT rzoff
	MOVB $1, L_RZ(SP)
	// xs and xsum with each group's value in 8 lanes, so that a pair of
	// groups multiplies its 16 lanes by one operand.
	MOVQ xs+56(FP), SI
	MOVQ xsum+64(FP), DI
	LEAQ L_XSX(SP), R8
	LEAQ L_XSUMX(SP), R9
rzexp:
	VBROADCASTSS (SI), Y0
	VMOVUPS Y0, (R8)
	VBROADCASTSS (DI), Y1
	VMOVUPS Y1, (R9)
	ADDQ $4, SI
	ADDQ $4, DI
	ADDQ $32, R8
	ADDQ $32, R9
	DECQ AX
	JNE rzexp
	MOVQ $q4zfold<>(SB), AX
	VMOVDQU64 (AX), Z16
	VMOVDQU64 64(AX), Z17
rzoff:
	// The prefetch's distance: D whole tiles (of row-major rows, whole
	// groups of 8 rows), D·8·qstride >= PFMIN; or, tiled, PFMIN itself
	// where one tile reaches it.
	MOVQ qstride+8(FP), BX
	SHLQ $3, BX
	MOVQ $(PFMIN-1), AX
	ADDQ BX, AX
	XORQ DX, DX
	DIVQ BX
	IMULQ AX, BX
	TESTB $16, mode+80(FP)
	JEQ rpfq
	CMPQ AX, $1
	JNE rpfq
	MOVQ $PFMIN, BX
rpfq:
	MOVQ BX, L_RPFQ(SP)
	MOVQ ng+32(FP), DX
	SHLQ $4, DX
	IMULQ DX, AX
	MOVQ AX, L_RPFS(SP)
	MOVQ q+0(FP), R13           // the tile's first row
	MOVQ scales+16(FP), R14
	MOVQ biases+24(FP), AX
	MOVQ AX, L_RB(SP)
	MOVQ out+72(FP), CX

rtile:
	VXORPS Y11, Y11, Y11
	// The pair's tile sums into Y25, which the scales' transposes (Y0-Y15)
	// leave alone.
	VXORPS Y25, Y25, Y25
	MOVQ $0, L_RG0(SP)
	CMPB L_RPAIR(SP), $0
	JEQ rstep
	// The scales and biases of the pair's tile the prefetch reaches, a
	// line at a time (the first rows' below).
	MOVQ L_RPFS(SP), AX
	LEAQ (R14)(AX*1), SI
	ADDQ L_RSOFF(SP), SI
	MOVQ L_RB(SP), DI
	ADDQ AX, DI
	ADDQ L_RBOFF(SP), DI
	MOVQ ng+32(FP), AX
	SHLQ $4, AX
	ADDQ $63, AX
	SHRQ $6, AX
rpfs2:
	PREFETCHT0 (SI)
	PREFETCHT0 (DI)
	ADDQ $64, SI
	ADDQ $64, DI
	DECQ AX
	JNE rpfs2
rstep:
	// R12: the weights of the tile the prefetch reaches (L_RPFQ bytes
	// on), for PF4 (rtz2 prefetches the pair's, L_RPOFF bytes on).
	// Without the prefetch mode, this tile's: TLOOP prefetches whatever
	// the mode, so that its loop tests nothing but its count (a test of
	// the mode a group cost 1-4% of the rate from memory), and lines this
	// tile reads anyway cost the memory nothing.
	MOVQ R13, R12
	TESTB $4, mode+80(FP)
	JEQ rchunk
	ADDQ L_RPFQ(SP), R12
	// A line of every 4 KB page of the tile PFFAR bytes beyond that
	// one (and of the pair's), into L2.
	MOVQ qstride+8(FP), SI
	SHLQ $3, SI
	LEAQ PFFAR(R12), AX
	ADDQ AX, SI
	XORQ DI, DI
	CMPB L_RPAIR(SP), $0
	JEQ rfar
	MOVQ L_RPOFF(SP), DI
rfar:
	PREFETCHT2 (AX)
	PREFETCHT2 (AX)(DI*1)
	ADDQ $4096, AX
	CMPQ AX, SI
	JLT rfar
	// The scales and biases of that tile (ng·16 bytes each, D tiles'
	// after this tile's), a line at a time.
	MOVQ L_RPFS(SP), AX
	LEAQ (R14)(AX*1), SI
	MOVQ L_RB(SP), DI
	ADDQ AX, DI
	MOVQ ng+32(FP), AX
	SHLQ $4, AX
	ADDQ $63, AX
	SHRQ $6, AX
rpfs:
	PREFETCHT0 (SI)
	PREFETCHT0 (DI)
	ADDQ $64, SI
	ADDQ $64, DI
	DECQ AX
	JNE rpfs
rchunk:
	MOVQ ng+32(FP), AX
	SUBQ L_RG0(SP), AX
	CMPQ AX, $KC
	JLE rkgset
	MOVQ $KC, AX
rkgset:
	MOVQ AX, L_RKG(SP)
	VMOVDQU Y11, L_RACC(SP)
	LEAQ (L_RST+63)(SP), DI
	ANDQ $~63, DI
	MOVB $0, L_RPASS(SP)
rtpass:
	MOVQ L_RG0(SP), AX
	SHLQ $1, AX
	MOVQ ng+32(FP), BX
	CMPQ BX, $1
	JNE rtrans
	// One group per row: the 8 rows' scales are consecutive.
	VCVTPH2PS (R14), Y0
	VMOVUPS Y0, (DI)
	MOVQ L_RB(SP), SI
	VCVTPH2PS (SI), Y0
	VMOVUPS Y0, 32(DI)
	JMP rtdone
rtrans:
	// Scales and biases of the chunk: 8 rows × kg halves, widened and
	// transposed. The mask covers the ceil(kg/2) dwords that hold them.
	MOVQ L_RKG(SP), SI
	INCQ SI
	SHRQ $1, SI
	VMOVQ SI, X0
	VPBROADCASTD X0, Y0
	VPCMPGTD IOTA, Y0, Y0
	VMOVDQU Y0, L_KMASK(SP)
	SHLQ $1, BX                 // row stride of the scales
	LEAQ (R14)(AX*1), SI
	T2ROWS
	CMPQ L_RKG(SP), $4
	JGT rtrans8
	// At most 4 groups: a row's floats fit 128 bits, and a 4×4 transpose
	// per 128-bit lane does (rows r and r+4 share a register).
	T4LOADH
	T4NET
	VMOVDQU Y8, (0*64)(DI)
	VMOVDQU Y9, (1*64)(DI)
	VMOVDQU Y10, (2*64)(DI)
	VMOVDQU Y11, (3*64)(DI)
	MOVQ L_RB(SP), SI
	ADDQ AX, SI
	T2ROWS
	T4LOADH
	T4NET
	VMOVDQU Y8, (0*64+32)(DI)
	VMOVDQU Y9, (1*64+32)(DI)
	VMOVDQU Y10, (2*64+32)(DI)
	VMOVDQU Y11, (3*64+32)(DI)
	JMP rtdone
rtrans8:
	T2LOADH
	T2NET
	VMOVDQU Y8, (0*64)(DI)
	VMOVDQU Y9, (1*64)(DI)
	VMOVDQU Y10, (2*64)(DI)
	VMOVDQU Y11, (3*64)(DI)
	VMOVDQU Y12, (4*64)(DI)
	VMOVDQU Y13, (5*64)(DI)
	VMOVDQU Y14, (6*64)(DI)
	VMOVDQU Y15, (7*64)(DI)
	MOVQ L_RG0(SP), AX
	SHLQ $1, AX
	MOVQ L_RB(SP), SI
	ADDQ AX, SI
	T2ROWS
	T2LOADH
	T2NET
	VMOVDQU Y8, (0*64+32)(DI)
	VMOVDQU Y9, (1*64+32)(DI)
	VMOVDQU Y10, (2*64+32)(DI)
	VMOVDQU Y11, (3*64+32)(DI)
	VMOVDQU Y12, (4*64+32)(DI)
	VMOVDQU Y13, (5*64+32)(DI)
	VMOVDQU Y14, (6*64+32)(DI)
	VMOVDQU Y15, (7*64+32)(DI)

rtdone:
	// A pair widens its tile's scales and biases the same way, RST2
	// bytes further on.
	CMPB L_RPAIR(SP), $0
	JEQ rgroups
	MOVQ L_RSOFF(SP), AX
	MOVQ L_RBOFF(SP), BX
	CMPB L_RPASS(SP), $0
	JNE rtback
	MOVB $1, L_RPASS(SP)
	ADDQ AX, R14
	ADDQ BX, L_RB(SP)
	ADDQ $RST2, DI
	JMP rtpass
rtback:
	SUBQ AX, R14
	SUBQ BX, L_RB(SP)
	SUBQ $RST2, DI

rgroups:
	MOVQ DI, R9                 // scales and biases of the group
	VMOVDQU L_RACC(SP), Y11
	VMOVDQU NIBBLES, Y10
	MOVQ L_RG0(SP), AX
	MOVQ AX, BX
	IMULQ L_RQG(SP), AX
	LEAQ (R13)(AX*1), SI        // row 0, group g0
	MOVQ BX, AX
	SHLQ $6, AX
	MOVQ x8+48(FP), DI
	ADDQ AX, DI
	SHLQ $2, BX
	MOVQ xs+56(FP), R11
	ADDQ BX, R11
	MOVQ xsum+64(FP), R10
	ADDQ BX, R10
	MOVQ qstride+8(FP), BX
	LEAQ (BX)(BX*2), DX
	LEAQ (SI)(BX*4), R8
	ADDQ BX, R8
	CMPB L_RPAIR(SP), $0
	JEQ rgroups1
	// The tiled path reads no rows at DX: with a pair it holds the
	// distance to the pair's tile.
	MOVQ L_RPOFF(SP), DX
rgroups1:
	MOVQ L_RKG(SP), AX
	CMPB L_RZ(SP), $0
	JEQ rgroup
	// Pairs of groups on Z registers; R11 and R10 walk the expanded xs
	// and xsum, whose first float is the group's value, as the Y path
	// reads it for an odd last group.
	MOVQ L_RG0(SP), R11
	SHLQ $5, R11
	LEAQ L_XSUMX(SP)(R11*1), R10
	LEAQ L_XSX(SP)(R11*1), R11
	VBROADCASTI64X4 NIBBLES, Z10
	SHRQ $1, AX
	JEQ rzodd
rzpair:
	PF8
	// The activations of g and g+1: low nibbles' halves, high nibbles'.
	VMOVDQU64 (DI), Z14
	VSHUFI64X2 $0x44, 64(DI), Z14, Z12
	VSHUFI64X2 $0xEE, 64(DI), Z14, Z13
	ZDOT((SI), Z0)
	ZDOT((SI)(BX*1), Z1)
	ZDOT((SI)(BX*2), Z2)
	ZDOT((SI)(DX*1), Z3)
	ZDOT((SI)(BX*4), Z4)
	ZDOT((R8), Z5)
	ZDOT((R8)(BX*1), Z6)
	ZDOT((R8)(BX*2), Z7)
	// rsum's folding in every 128-bit lane: lane k of Z0 holds rows 0-3's
	// sums of dwords 4k..4k+3, of Z4 rows 4-7's; then lanes 0 and 1 add
	// up to g's sums, 2 and 3 to g+1's: Z1 is g's 8 rows, then g+1's.
	VPUNPCKLDQ Z1, Z0, Z8
	VPUNPCKHDQ Z1, Z0, Z0
	VPADDD Z8, Z0, Z0
	VPUNPCKLDQ Z3, Z2, Z8
	VPUNPCKHDQ Z3, Z2, Z2
	VPADDD Z8, Z2, Z2
	VPUNPCKLDQ Z5, Z4, Z8
	VPUNPCKHDQ Z5, Z4, Z4
	VPADDD Z8, Z4, Z4
	VPUNPCKLDQ Z7, Z6, Z8
	VPUNPCKHDQ Z7, Z6, Z6
	VPADDD Z8, Z6, Z6
	VPUNPCKLQDQ Z2, Z0, Z8
	VPUNPCKHQDQ Z2, Z0, Z0
	VPADDD Z8, Z0, Z0
	VPUNPCKLQDQ Z6, Z4, Z8
	VPUNPCKHQDQ Z6, Z4, Z4
	VPADDD Z8, Z4, Z4
	VMOVDQA64 Z0, Z1
	VPERMT2Q Z4, Z16, Z0        // lanes 0 and 2 of Z0 and Z4
	VPERMT2Q Z4, Z17, Z1        // lanes 1 and 3
	VPADDD Z0, Z1, Z1
	// The float part as in rsum, for both groups at once; the
	// accumulators take g's results, then g+1's.
	VCVTDQ2PS Z1, Z1
	VMOVUPS (R9), Z14                   // g's scales and biases
	VSHUFF64X2 $0x44, 64(R9), Z14, Z15  // g's and g+1's scales
	VSHUFF64X2 $0xEE, 64(R9), Z14, Z14  // their biases
	VMULPS (R11), Z15, Z15              // scale·xs
	VMULPS Z15, Z1, Z1
	VMULPS (R10), Z14, Z14              // bias·xsum
	VADDPS Z14, Z1, Z1
	VADDPS Y1, Y11, Y11
	VEXTRACTF64X4 $1, Z1, Y1
	VADDPS Y1, Y11, Y11
	ADDQ $64, SI
	ADDQ $64, R8
	ADDQ $128, DI
	ADDQ $64, R11
	ADDQ $64, R10
	ADDQ $128, R9
	DECQ AX
	JNE rzpair
rzodd:
	// An odd last group takes the Y path.
	TESTB $1, L_RKG(SP)
	JEQ rnext
	MOVQ $1, AX
rgroup:
	TESTB $4, mode+80(FP)
	JEQ rnopf
	PF4
rnopf:
	TESTB $16, mode+80(FP)
	JNE rtiled
	TESTB $1, mode+80(FP)
	JNE rvnni
	RDOT8(RDOT2)
	JMP rsum
rvnni:
	RDOT8(RDOTV)
	JMP rsum
rtiled:
	TESTB $8, mode+80(FP)
	JNE rtz
	TESTB $1, mode+80(FP)
	JNE rtv
	// AVX2: rows 0-3 into Y0, 4-7 into Y2. Each tiled path loops over
	// the chunk's groups itself (TLOOP): the memory streams the tiles
	// faster under a loop of few branches than through rgroup's tests of
	// the mode after every group.
rta:
	VPXOR Y0, Y0, Y0
	VPXOR Y2, Y2, Y2
	TQAK(0)
	TQAK(1)
	TQAK(2)
	TQAK(3)
	TQFOLD(Y0, Y2)
	TLOOP(rta)
rtv:
	// VNNI on Y registers: rows 0-3 into Y0 and Y1, 4-7 into Y2 and Y3
	// (two chains each).
	VPBROADCASTQ 0(DI), Y16
	VPBROADCASTQ 8(DI), Y17
	VPBROADCASTQ 16(DI), Y18
	VPBROADCASTQ 24(DI), Y19
	VPBROADCASTQ 32(DI), Y20
	VPBROADCASTQ 40(DI), Y21
	VPBROADCASTQ 48(DI), Y22
	VPBROADCASTQ 56(DI), Y23
	VPXOR Y0, Y0, Y0
	VPXOR Y1, Y1, Y1
	VPXOR Y2, Y2, Y2
	VPXOR Y3, Y3, Y3
	TQV(0, 0, Y16, Y20, Y0)
	TQV(0, 32, Y16, Y20, Y2)
	TQV(1, 0, Y17, Y21, Y1)
	TQV(1, 32, Y17, Y21, Y3)
	TQV(2, 0, Y18, Y22, Y0)
	TQV(2, 32, Y18, Y22, Y2)
	TQV(3, 0, Y19, Y23, Y1)
	TQV(3, 32, Y19, Y23, Y3)
	VPADDD Y1, Y0, Y0
	VPADDD Y3, Y2, Y2
	TQFOLD(Y0, Y2)
	TLOOP(rtv)
rtz:
	CMPB L_RPAIR(SP), $0
	JNE rtz2
	// VNNI on Z registers: all 8 rows a register, row r in dwords 2r
	// and 2r+1; two chains of low nibbles, two of high.
	TQZCAST
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	TQZ4(SI, Z0, Z1, Z2, Z3)
	VPADDD Z2, Z0, Z0
	VPADDD Z3, Z1, Z1
	TQZFOLD(Z0, Z1, Y1)
	TLOOP(rtz)
rsum:
	// Fold to one exact sum per row (dword then qword interleaves, then
	// across 128-bit lanes): lane r of Y1 is row r's.
	VPUNPCKLDQ Y1, Y0, Y8
	VPUNPCKHDQ Y1, Y0, Y0
	VPADDD Y8, Y0, Y0
	VPUNPCKLDQ Y3, Y2, Y8
	VPUNPCKHDQ Y3, Y2, Y2
	VPADDD Y8, Y2, Y2
	VPUNPCKLDQ Y5, Y4, Y8
	VPUNPCKHDQ Y5, Y4, Y4
	VPADDD Y8, Y4, Y4
	VPUNPCKLDQ Y7, Y6, Y8
	VPUNPCKHDQ Y7, Y6, Y6
	VPADDD Y8, Y6, Y6
	VPUNPCKLQDQ Y2, Y0, Y8
	VPUNPCKHQDQ Y2, Y0, Y0
	VPADDD Y8, Y0, Y0
	VPUNPCKLQDQ Y6, Y4, Y8
	VPUNPCKHQDQ Y6, Y4, Y4
	VPADDD Y8, Y4, Y4
	VPERM2I128 $0x20, Y4, Y0, Y1
	VPERM2I128 $0x31, Y4, Y0, Y2
	VPADDD Y2, Y1, Y1
rfloat:
	VBROADCASTSS (R11), Y14
	VBROADCASTSS (R10), Y15
	RFLOAT(Y1, (R9), 32(R9), Y11)
radv:
	ADDQ L_RQG(SP), SI
	ADDQ L_RQG(SP), R8
	ADDQ $64, DI
	ADDQ $4, R11
	ADDQ $4, R10
	ADDQ $64, R9
	DECQ AX
	JNE rgroup

rnext:
	MOVQ L_RG0(SP), AX
	ADDQ $KC, AX
	MOVQ AX, L_RG0(SP)
	CMPQ AX, ng+32(FP)
	JLT rchunk
	VMOVUPS Y11, (CX)
	CMPB L_RPAIR(SP), $0
	JEQ rnext1
	MOVQ L_ROOFF(SP), AX
	VMOVUPS Y25, (CX)(AX*1)
rnext1:
	ADDQ $32, CX
	MOVQ qstride+8(FP), AX
	SHLQ $3, AX
	ADDQ AX, R13
	MOVQ ng+32(FP), AX
	SHLQ $4, AX
	ADDQ AX, R14
	ADDQ AX, L_RB(SP)
	DECQ L_RTILES(SP)
	JNE rtile
rdone:
	VZEROUPPER
	RET

rtz2:
	// A group of two tiles: the pair's at R8, DX bytes on; the
	// activations' broadcasts serve both. PF4 has prefetched the next
	// tile of the first rows; this, the pair's. A loop over the chunk's
	// groups, as rtz's.
	PREFETCHT0 -256(R12)(DX*1)
	PREFETCHT0 -192(R12)(DX*1)
	PREFETCHT0 -128(R12)(DX*1)
	PREFETCHT0 -64(R12)(DX*1)
	LEAQ (SI)(DX*1), R8
	TQZCAST
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z4, Z4, Z4
	VPXORD Z5, Z5, Z5
	TQZ4(SI, Z0, Z1, Z0, Z1)
	TQZ4(R8, Z4, Z5, Z4, Z5)
	TQZFOLD(Z0, Z1, Y1)
	TQZFOLD(Z4, Z5, Y5)
	// rfloat's arithmetic for each tile, the first's scales at R9, the
	// pair's RST2 bytes on.
	VBROADCASTSS (R11), Y14
	VBROADCASTSS (R10), Y15
	RFLOAT(Y1, (R9), 32(R9), Y11)
	RFLOAT(Y5, RST2(R9), (RST2+32)(R9), Y25)
	TNEXT
	JEQ rnext
	PF4
	JMP rtz2

// UTRANS transposes the 4×4 qwords of Y0-Y3 (row r's qword k in lane r
// of Yk) into rows in Y12-Y15.
#define UTRANS \
	VPUNPCKLQDQ Y1, Y0, Y8 \
	VPUNPCKHQDQ Y1, Y0, Y9 \
	VPUNPCKLQDQ Y3, Y2, Y10 \
	VPUNPCKHQDQ Y3, Y2, Y11 \
	VPERM2I128 $0x20, Y10, Y8, Y12 \
	VPERM2I128 $0x20, Y11, Y9, Y13 \
	VPERM2I128 $0x31, Y10, Y8, Y14 \
	VPERM2I128 $0x31, Y11, Y9, Y15

// func untileAVX2(dst *byte, rb int, src *byte, ng int)
//
// A tile of 8 rows of rb bytes, tiled at src (Mat.Tiled: per group, row
// r's qword k at k·64 + r·8), row-major to dst: per group, 256 bytes read
// in order, two 4×4 transposes of qwords, and 8 stores rb apart. It
// prefetches the lines 1 KB ahead, past the tile's end too (prefetches
// never fault).
TEXT ·untileAVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ rb+8(FP), BX
	MOVQ src+16(FP), SI
	MOVQ ng+24(FP), CX
	LEAQ (BX)(BX*2), DX
	LEAQ (DI)(BX*4), R8
	TESTQ CX, CX
	JEQ udone
uloop:
	PREFETCHT0 1024(SI)
	PREFETCHT0 1088(SI)
	PREFETCHT0 1152(SI)
	PREFETCHT0 1216(SI)
	// Rows 0-3: qword k of each in Yk.
	VMOVDQU (SI), Y0
	VMOVDQU 64(SI), Y1
	VMOVDQU 128(SI), Y2
	VMOVDQU 192(SI), Y3
	UTRANS
	VMOVDQU Y12, (DI)
	VMOVDQU Y13, (DI)(BX*1)
	VMOVDQU Y14, (DI)(BX*2)
	VMOVDQU Y15, (DI)(DX*1)
	// Rows 4-7.
	VMOVDQU 32(SI), Y0
	VMOVDQU 96(SI), Y1
	VMOVDQU 160(SI), Y2
	VMOVDQU 224(SI), Y3
	UTRANS
	VMOVDQU Y12, (R8)
	VMOVDQU Y13, (R8)(BX*1)
	VMOVDQU Y14, (R8)(BX*2)
	VMOVDQU Y15, (R8)(DX*1)
	ADDQ $256, SI
	ADDQ $32, DI
	ADDQ $32, R8
	DECQ CX
	JNE uloop
udone:
	VZEROUPPER
	RET
