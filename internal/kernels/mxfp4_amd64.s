//go:build amd64

#include "textflag.h"
#include "prefetch_amd64.h"

// BCASTD broadcasts the dword v to every lane of z (x: z's low 128 bits),
// through AX.
#define BCASTD(v, x, z) \
	MOVL v, AX \
	VMOVD AX, x \
	VPBROADCASTD x, z

// mxfp4Rows(q, e8 *byte, nblk, n int, x8 *int8, xs *float32, out *float32, avx512 bool)
//
// For each of n weight rows, the integer part runs eight blocks of 32 at a
// time. AVX2: a block's 16 code bytes widen to words, b | b<<4 masked with
// 0x0f puts the low nibble in the even byte and the high one in the odd
// byte (the checkpoint's order), VPSHUFB maps codes to mxCode, and
// VPSIGNB/VPABSB/VPMADDUBSW/VPMADDWD give eight int32 partial sums (each
// int16 pair at most 2·12·127 = 3048). AVX-512: two blocks per Z register,
// codes mapped to mxCode+12 (unsigned) for VPDPBUSD, minus VPDPBUSD of 12
// and x8. Either way the partial sums of the eight blocks reduce to one
// vector of exact block sums [b0..b7]; the float part (see mxfp4.go) then
// multiplies by mxScale[s]·xs and adds the eight products to the row's
// accumulator one at a time, in block order, as dotMXFP4I8 does. The last
// nblk%8 blocks run one at a time with the same arithmetic.

DATA mxlut<>+0(SB)/8, $0x0c08060403020100
DATA mxlut<>+8(SB)/8, $0xf4f8fafcfdfeff00
DATA mxlut<>+16(SB)/8, $0x181412100f0e0d0c
DATA mxlut<>+24(SB)/8, $0x00040608090a0b0c
GLOBL mxlut<>(SB), RODATA|NOPTR, $32

// BLK2 computes block sums of the block at code offset c, activation
// offset x into Y register v (eight int32 lanes).
#define BLK2(c, x, v) \
	VPMOVZXBW c(SI), Y11 \
	VPSLLW    $4, Y11, Y12 \
	VPOR      Y12, Y11, Y11 \
	VPAND     Y9, Y11, Y11 \
	VPSHUFB   Y11, Y8, Y11 \
	VMOVDQU   x(AX), Y12 \
	VPSIGNB   Y11, Y12, Y12 \
	VPABSB    Y11, Y11 \
	VPMADDUBSW Y12, Y11, Y11 \
	VPMADDWD  Y10, Y11, v

// BLK512 computes the partial sums of blocks 2k and 2k+1 (codes at c,
// activations at x) into Z register v, using Z register u as scratch.
#define BLK512(c, x, v, u) \
	VPMOVZXBW c(SI), Z11 \
	VPSLLW    $4, Z11, Z12 \
	VPORD     Z12, Z11, Z11 \
	VPANDD    Z9, Z11, Z11 \
	VPSHUFB   Z11, Z15, Z11 \
	VMOVDQU64 x(AX), Z12 \
	VPXORD    v, v, v \
	VPXORD    u, u, u \
	VPDPBUSD  Z12, Z11, v \
	VPDPBUSD  Z12, Z14, u \
	VPSUBD    u, v, v

// ACC adds the four lanes of X0 to the accumulator X13, lane 0 first.
#define ACC \
	VADDSS  X0, X13, X13 \
	VSHUFPS $0x55, X0, X0, X1 \
	VADDSS  X1, X13, X13 \
	VSHUFPS $0xaa, X0, X0, X1 \
	VADDSS  X1, X13, X13 \
	VSHUFPS $0xff, X0, X0, X1 \
	VADDSS  X1, X13, X13

TEXT ·mxfp4Rows(SB), NOSPLIT, $0-57
	MOVQ q+0(FP), SI
	MOVQ e8+8(FP), R8
	MOVQ nblk+16(FP), R9
	MOVQ n+24(FP), R10
	MOVQ x8+32(FP), DI
	MOVQ xs+40(FP), R11
	MOVQ out+48(FP), DX
	LEAQ ·mxScale(SB), R12
	TESTQ R10, R10
	JLE  done
	VBROADCASTI128 mxlut<>+0(SB), Y8
	MOVL $0x0f0f0f0f, CX
	VMOVD CX, X9
	VPBROADCASTD X9, Y9
	MOVL $0x00010001, CX
	VMOVD CX, X10
	VPBROADCASTD X10, Y10
	CMPB avx512+56(FP), $0
	JEQ  row
	VBROADCASTI32X4 mxlut<>+16(SB), Z15
	VPBROADCASTD X9, Z9
	MOVL $0x0c0c0c0c, CX
	VMOVD CX, X14
	VPBROADCASTD X14, Z14

row:
	MOVQ DI, AX
	MOVQ R11, BX
	MOVQ R9, R13
	VXORPS X13, X13, X13

blk8:
	CMPQ R13, $8
	JLT  tail
	CMPB avx512+56(FP), $0
	JNE  blk8z
	BLK2(0, 0, Y0)
	BLK2(16, 32, Y1)
	BLK2(32, 64, Y2)
	BLK2(48, 96, Y3)
	BLK2(64, 128, Y4)
	BLK2(80, 160, Y5)
	BLK2(96, 192, Y6)
	BLK2(112, 224, Y7)
	JMP  reduce

blk8z:
	BLK512(0, 0, Z0, Z4)
	BLK512(32, 64, Z1, Z5)
	BLK512(64, 128, Z2, Z6)
	BLK512(96, 192, Z3, Z7)
	// Spread the pairs over Y0..Y7, one block each.
	VEXTRACTI64X4 $1, Z3, Y7
	VMOVDQA Y3, Y6
	VEXTRACTI64X4 $1, Z2, Y5
	VMOVDQA Y2, Y4
	VEXTRACTI64X4 $1, Z1, Y3
	VMOVDQA Y1, Y2
	VEXTRACTI64X4 $1, Z0, Y1

reduce:
	// Y0..Y7 → Y0 = [Σb0 .. Σb7].
	VPHADDD Y1, Y0, Y0
	VPHADDD Y3, Y2, Y2
	VPHADDD Y5, Y4, Y4
	VPHADDD Y7, Y6, Y6
	VPHADDD Y2, Y0, Y0
	VPHADDD Y6, Y4, Y4
	VPERM2I128 $0x20, Y4, Y0, Y1
	VPERM2I128 $0x31, Y4, Y0, Y2
	VPADDD  Y2, Y1, Y0
	VCVTDQ2PS Y0, Y0
	// c = mxScale[s]·xs for the eight blocks.
	VPMOVZXBD (R8), Y1
	VPCMPEQD Y2, Y2, Y2
	VPGATHERDD Y2, (R12)(Y1*4), Y3
	VMOVUPS (BX), X4
	VUNPCKLPS X4, X4, X5
	VUNPCKHPS X4, X4, X6
	VINSERTF128 $1, X6, Y5, Y5
	VMULPS  Y5, Y3, Y3
	VMULPS  Y3, Y0, Y0
	ACC
	VEXTRACTF128 $1, Y0, X0
	ACC
	ADDQ $128, SI
	ADDQ $8, R8
	ADDQ $256, AX
	ADDQ $16, BX
	SUBQ $8, R13
	JMP  blk8

tail:
	TESTQ R13, R13
	JEQ  rowdone
	BLK2(0, 0, Y0)
	VEXTRACTI128 $1, Y0, X1
	VPADDD X1, X0, X0
	VPSHUFD $0x4e, X0, X1
	VPADDD X1, X0, X0
	VPSHUFD $0xb1, X0, X1
	VPADDD X1, X0, X0
	VCVTDQ2PS X0, X0
	// xs of this block: index (nblk−left)/2.
	MOVQ R9, CX
	SUBQ R13, CX
	SHRQ $1, CX
	VMOVSS (R11)(CX*4), X4
	MOVBLZX (R8), CX
	VMOVSS (R12)(CX*4), X3
	VMULSS X4, X3, X3
	VMULSS X3, X0, X0
	VADDSS X0, X13, X13
	ADDQ $16, SI
	INCQ R8
	ADDQ $32, AX
	DECQ R13
	JMP  tail

rowdone:
	VMOVSS X13, (DX)
	ADDQ $4, DX
	DECQ R10
	JNZ  row

done:
	VZEROUPPER
	RET

// mxfp4Tile(tile *byte, nblk, n int, x8 *int8, xs *float32, sx12 *int32, nb int, out *float32, ostride int)
//
// The batched AVX-512 kernel: a tile of 16 weight rows (one per lane,
// rows ≥ n masked at the store) against nb activation rows. mxPrepTile laid
// the tile out per block as 8 × 64 bytes, the codes as mxCode+12 (unsigned)
// for values 4k..4k+3 of each row, then the 16 rows' mxScale factors, so
// that VPDPBUSD of 64 tile bytes and four broadcast activation bytes adds
// to every row's block sum at once. sx12 holds 12·Σx8 per activation row
// and block, which takes the +12 back out exactly. The float part is
// dotMXFP4I8's, one lane per row.
#define TBLK 576

// DOT4 adds the products of block codes at t and activations at x, k = 0..3
// or 4..7 (off), into acc.
#define DOT4(t, x, off, acc) \
	VMOVDQU32 (t+(off)*64)(AX), Z3 \
	VPBROADCASTD (x+(off)*4)(BX), Z2 \
	VPDPBUSD Z2, Z3, acc \
	VMOVDQU32 (t+(off+1)*64)(AX), Z3 \
	VPBROADCASTD (x+(off+1)*4)(BX), Z2 \
	VPDPBUSD Z2, Z3, acc \
	VMOVDQU32 (t+(off+2)*64)(AX), Z3 \
	VPBROADCASTD (x+(off+2)*4)(BX), Z2 \
	VPDPBUSD Z2, Z3, acc \
	VMOVDQU32 (t+(off+3)*64)(AX), Z3 \
	VPBROADCASTD (x+(off+3)*4)(BX), Z2 \
	VPDPBUSD Z2, Z3, acc

// FLT finishes a block: integer sum (lo + hi − 12Σx8 at s), then
// acc += float32(sum) · (scales at t · xs in Z5).
#define FLT(lo, hi, t, s) \
	VPADDD hi, lo, lo \
	VPBROADCASTD s(R14), Z4 \
	VPSUBD Z4, lo, lo \
	VCVTDQ2PS lo, lo \
	VMULPS (t+512)(AX), Z5, Z3 \
	VMULPS Z3, lo, lo \
	VADDPS lo, Z0, Z0

TEXT ·mxfp4Tile(SB), NOSPLIT, $0-72
	MOVQ tile+0(FP), SI
	MOVQ nblk+8(FP), R8
	MOVQ n+16(FP), CX
	MOVQ x8+24(FP), BX
	MOVQ xs+32(FP), R10
	MOVQ sx12+40(FP), R14
	MOVQ nb+48(FP), R12
	MOVQ out+56(FP), DX
	MOVQ ostride+64(FP), R13
	MOVL $1, AX
	SHLL CX, AX
	DECL AX
	KMOVW AX, K1
	TESTQ R12, R12
	JLE  tdone
	TESTQ R8, R8
	JLE  tdone

trow:
	MOVQ SI, AX
	MOVQ R8, CX
	VXORPS Z0, Z0, Z0

tpair:
	VBROADCASTSS (R10), Z5
	VPXORD Z1, Z1, Z1
	VPXORD Z6, Z6, Z6
	VPXORD Z7, Z7, Z7
	VPXORD Z8, Z8, Z8
	DOT4(0, 0, 0, Z1)
	DOT4(TBLK, 32, 0, Z7)
	DOT4(0, 0, 4, Z6)
	DOT4(TBLK, 32, 4, Z8)
	FLT(Z1, Z6, 0, 0)
	FLT(Z7, Z8, TBLK, 4)
	ADDQ $(2*TBLK), AX
	ADDQ $64, BX
	ADDQ $8, R14
	ADDQ $4, R10
	SUBQ $2, CX
	JGT  tpair

	VMOVUPS Z0, K1, (DX)
	ADDQ R13, DX
	DECQ R12
	JNZ  trow

tdone:
	VZEROUPPER
	RET

DATA mxpat<>+0(SB)/8, $0x0505040401010000
DATA mxpat<>+8(SB)/8, $0x0d0d0c0c09090808
DATA mxpat<>+16(SB)/8, $0x0707060603030202
DATA mxpat<>+24(SB)/8, $0x0f0f0e0e0b0b0a0a
DATA mxpat<>+32(SB)/4, $0
DATA mxpat<>+36(SB)/4, $1
DATA mxpat<>+40(SB)/4, $2
DATA mxpat<>+44(SB)/4, $3
DATA mxpat<>+48(SB)/4, $4
DATA mxpat<>+52(SB)/4, $5
DATA mxpat<>+56(SB)/4, $6
DATA mxpat<>+60(SB)/4, $7
DATA mxpat<>+64(SB)/4, $8
DATA mxpat<>+68(SB)/4, $9
DATA mxpat<>+72(SB)/4, $10
DATA mxpat<>+76(SB)/4, $11
DATA mxpat<>+80(SB)/4, $12
DATA mxpat<>+84(SB)/4, $13
DATA mxpat<>+88(SB)/4, $14
DATA mxpat<>+92(SB)/4, $15
GLOBL mxpat<>(SB), RODATA|NOPTR, $96

// PREPK writes k's 64 tile bytes at off(DI): a masked gather of each row's
// dword at byte src of the block (SI), whose bytes pat picks as b0 b0 b1 b1
// per row, the odd ones shifted down a nibble, masked, mapped to mxCode+12.
#define PREPK(src, pat, off) \
	VPXORD Z1, Z1, Z1 \
	KMOVW K1, K2 \
	VPGATHERDD src(SI)(Z10*1), K2, Z1 \
	VPSHUFB pat, Z1, Z1 \
	VPSRLW $4, Z1, Z2 \
	VPBLENDMB Z2, Z1, K3, Z1 \
	VPANDD Z13, Z1, Z1 \
	VPSHUFB Z1, Z14, Z1 \
	VMOVDQU32 Z1, K1, off(DI)

// mxPrepTileAVX512(tile, q, e8 *byte, nblk, n, qstride int) is mxPrepTile's
// rearrangement of n rows (the caller clears a partial tile): per block,
// eight masked gathers of 16 rows' code pairs (k = 0 from the block's first
// dword, k ≥ 1 from the high half of the dword at 2k−2, so that no read
// passes the block's last byte), then the rows' scale factors one by one.
TEXT ·mxPrepTileAVX512(SB), NOSPLIT, $0-48
	MOVQ tile+0(FP), DI
	MOVQ q+8(FP), SI
	MOVQ e8+16(FP), R8
	MOVQ nblk+24(FP), R10
	MOVQ n+32(FP), R11
	MOVQ qstride+40(FP), CX
	LEAQ ·mxScale(SB), R12
	TESTQ R11, R11
	JLE  pdone
	TESTQ R10, R10
	JLE  pdone
	VMOVD CX, X2
	VPBROADCASTD X2, Z2
	VMOVDQU32 mxpat<>+32(SB), Z10
	VPMULLD Z2, Z10, Z10
	VBROADCASTI32X4 mxpat<>+0(SB), Z11
	VBROADCASTI32X4 mxpat<>+16(SB), Z12
	VBROADCASTI32X4 mxlut<>+16(SB), Z14
	BCASTD($0x0f0f0f0f, X13, Z13)
	MOVQ $0xaaaaaaaaaaaaaaaa, AX
	KMOVQ AX, K3
	MOVL $1, AX
	MOVQ R11, CX
	SHLL CX, AX
	DECL AX
	KMOVW AX, K1
	MOVQ R8, R9
	MOVQ R10, R13

pblk:
	PREPK(0, Z11, 0)
	PREPK(0, Z12, 64)
	PREPK(2, Z12, 128)
	PREPK(4, Z12, 192)
	PREPK(6, Z12, 256)
	PREPK(8, Z12, 320)
	PREPK(10, Z12, 384)
	PREPK(12, Z12, 448)
	// Scale factors of rows 0..n-1 (bytes R10 apart from R9).
	MOVQ R9, BX
	XORQ CX, CX

pscale:
	MOVBLZX (BX), AX
	MOVL (R12)(AX*4), AX
	MOVL AX, 512(DI)(CX*4)
	ADDQ R10, BX
	INCQ CX
	CMPQ CX, R11
	JLT  pscale

	ADDQ $16, SI
	INCQ R9
	ADDQ $576, DI
	DECQ R13
	JNZ  pblk

pdone:
	VZEROUPPER
	RET

// mxfp4Tiled(q, e8 *byte, nblk, ntiles int, xp *int8, sx12 *int32, xs *float32, out *float32)
//
// The decode kernel of the tiled layout (TileMXFP4): one row of the tile
// per 32-bit lane. Line j of a block holds dword j of each row's codes,
// values 8j..8j+7: the low nibbles (the even values) and the high ones,
// each mapped to mxCode+12, go through VPDPBUSD against the activations'
// even and odd values of those eight (mxPermX) broadcast, into the rows'
// lanes. At the end of the block 12·Σx8 takes the +12 back out, and the
// float part is dotMXFP4I8's, 16 rows at once: c = xs·2^(s−128) (VSCALEFPS,
// exact as mxScale[s]·xs is, a power of two times xs rounded once), then
// acc += float32(sum)·c. Two blocks a step share their group's xs.

// MXPF is how far ahead of each line of codes the kernel prefetches it
// (the tiles are one sequential stream). On one thread of a 2-core Zen 4,
// gpt-oss's 2880×2880 matrices streamed at 0.83-0.86 of plain reads' rate
// 2 KB ahead, 0.87-0.89 at 4 KB, 0.90-0.95 at 8 KB, 0.88-0.91 at 12 KB and
// 0.87-0.88 at 16 KB (BenchmarkMXFP4DecodeDRAM's share1-tiled, builds
// alternating).
#define MXPF 8192

// MXLINE adds line c's codes times the activations' dwords at x (even
// values) and x+4 (odd values) into lo and hi.
#define MXLINE(c, x, lo, hi) \
	PREFETCHT0 (c+MXPF)(SI) \
	VMOVDQU64 c(SI), Z3 \
	VPSRLW    $4, Z3, Z4 \
	VPANDD    Z9, Z3, Z3 \
	VPANDD    Z9, Z4, Z4 \
	VPSHUFB   Z3, Z15, Z3 \
	VPSHUFB   Z4, Z15, Z4 \
	VPDPBUSD.BCST x(AX), Z3, lo \
	VPDPBUSD.BCST x+4(AX), Z4, hi

// MXBLK adds the block with codes at c(SI), activations at x(AX), 12·Σx8
// at s(BX) and scale bytes at e(DI) to the rows' accumulators Z0.
#define MXBLK(c, x, s, e, lo, hi) \
	VPXORD lo, lo, lo \
	VPXORD hi, hi, hi \
	MXLINE(c, x, lo, hi) \
	MXLINE(c+64, x+8, lo, hi) \
	MXLINE(c+128, x+16, lo, hi) \
	MXLINE(c+192, x+24, lo, hi) \
	VPADDD hi, lo, lo \
	VPSUBD.BCST s(BX), lo, lo \
	VCVTDQ2PS lo, lo \
	VPMOVZXBD e(DI), hi \
	VPSUBD Z10, hi, hi \
	VCVTDQ2PS hi, hi \
	VSCALEFPS hi, Z8, hi \
	VMULPS hi, lo, lo \
	VADDPS lo, Z0, Z0

TEXT ·mxfp4Tiled(SB), NOSPLIT, $0-64
	MOVQ q+0(FP), SI
	MOVQ e8+8(FP), DI
	MOVQ nblk+16(FP), R8
	MOVQ ntiles+24(FP), R9
	MOVQ xp+32(FP), R10
	MOVQ sx12+40(FP), R11
	MOVQ xs+48(FP), R12
	MOVQ out+56(FP), DX
	TESTQ R9, R9
	JLE  xdone
	TESTQ R8, R8
	JLE  xdone
	VBROADCASTI32X4 mxlut<>+16(SB), Z15
	BCASTD($0x0f0f0f0f, X9, Z9)
	BCASTD($128, X10, Z10)

xtile:
	MOVQ R10, AX
	MOVQ R11, BX
	MOVQ R12, CX
	MOVQ R8, R13
	VXORPS Z0, Z0, Z0

xpair:
	VBROADCASTSS (CX), Z8
	MXBLK(0, 0, 0, 0, Z1, Z2)
	MXBLK(256, 32, 4, 16, Z5, Z6)
	ADDQ $512, SI
	ADDQ $32, DI
	ADDQ $64, AX
	ADDQ $8, BX
	ADDQ $4, CX
	SUBQ $2, R13
	JGT  xpair

	VMOVUPS Z0, (DX)
	ADDQ $64, DX
	DECQ R9
	JNZ  xtile

xdone:
	VZEROUPPER
	RET

// Within each 8 activations, the even ones then the odd ones.
DATA mxperm<>+0(SB)/8, $0x0705030106040200
DATA mxperm<>+8(SB)/8, $0x0f0d0b090e0c0a08
GLOBL mxperm<>(SB), RODATA|NOPTR, $16

// mxPrepXAVX512(xp *int8, sx12 *int32, x8 *int8, nblk int): two blocks
// (64 activations) a step: the permutation by VPSHUFB, each block's sum
// by VPDPBUSD of ones and a reduction of its eight lanes, times 12.
TEXT ·mxPrepXAVX512(SB), NOSPLIT, $0-32
	MOVQ xp+0(FP), DI
	MOVQ sx12+8(FP), BX
	MOVQ x8+16(FP), SI
	MOVQ nblk+24(FP), CX
	TESTQ CX, CX
	JLE  pxdone
	VBROADCASTI32X4 mxperm<>+0(SB), Z1
	BCASTD($0x01010101, X2, Z2)
	MOVL $12, AX
	VMOVD AX, X12
	VPBROADCASTD X12, X12

pxloop:
	VMOVDQU64 (SI), Z0
	VPSHUFB   Z1, Z0, Z3
	VMOVDQU64 Z3, (DI)
	VPXORD    Z4, Z4, Z4
	VPDPBUSD  Z0, Z2, Z4
	VEXTRACTI64X4 $1, Z4, Y5
	VPHADDD   Y5, Y4, Y6
	VPHADDD   Y6, Y6, Y6
	VEXTRACTI128 $1, Y6, X7
	VPADDD    X7, X6, X6
	VPMULLD   X12, X6, X6
	VMOVQ     X6, (BX)
	ADDQ $64, SI
	ADDQ $64, DI
	ADDQ $8, BX
	SUBQ $2, CX
	JGT  pxloop

pxdone:
	VZEROUPPER
	RET

// PTLINE writes line c of a stored tile's block (dword j of 16 rows) as
// k = 2j and 2j+1 of mxPrepTile's layout at o(DI): nibbles apart, the
// rows' bytes interleaved low, high (values 8j..8j+7 in order, eight bytes
// a row), mapped to mxCode+12, and the dwords regrouped by k.
#define PTLINE(c, o) \
	VMOVDQU64  c(SI), Z1 \
	VPSRLW     $4, Z1, Z2 \
	VPANDD     Z13, Z1, Z1 \
	VPANDD     Z13, Z2, Z2 \
	VPUNPCKLBW Z2, Z1, Z3 \
	VPUNPCKHBW Z2, Z1, Z4 \
	VPSHUFB    Z3, Z14, Z3 \
	VPSHUFB    Z4, Z14, Z4 \
	VSHUFPS    $0x88, Z4, Z3, Z5 \
	VSHUFPS    $0xdd, Z4, Z3, Z6 \
	VMOVDQU64  Z5, o(DI) \
	VMOVDQU64  Z6, o+64(DI)

// mxPrepTileTiled(tile, q, e8 *byte, nblk int)
TEXT ·mxPrepTileTiled(SB), NOSPLIT, $0-32
	MOVQ tile+0(FP), DI
	MOVQ q+8(FP), SI
	MOVQ e8+16(FP), R8
	MOVQ nblk+24(FP), CX
	TESTQ CX, CX
	JLE  ptdone
	VBROADCASTI32X4 mxlut<>+16(SB), Z14
	BCASTD($0x0f0f0f0f, X13, Z13)
	BCASTD($128, X10, Z10)
	BCASTD($0x3f800000, X11, Z11)

ptblk:
	PTLINE(0, 0)
	PTLINE(64, 128)
	PTLINE(128, 256)
	PTLINE(192, 384)
	VPMOVZXBD (R8), Z1
	VPSUBD    Z10, Z1, Z1
	VCVTDQ2PS Z1, Z1
	VSCALEFPS Z1, Z11, Z1
	VMOVUPS   Z1, 512(DI)
	ADDQ $256, SI
	ADDQ $16, R8
	ADDQ $576, DI
	DECQ CX
	JNZ  ptblk

ptdone:
	VZEROUPPER
	RET

// mxTileCodesAVX512(dst, src *byte, rb, nblk int) writes the codes of one
// tile of 16 rows (src, rb bytes a row) in the tiled layout (TileMXFP4)
// to dst: per block and line j, one gather of dword j of the 16 rows.
TEXT ·mxTileCodesAVX512(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ rb+16(FP), CX
	MOVQ nblk+24(FP), R8
	TESTQ R8, R8
	JLE  tcdone
	VMOVD CX, X2
	VPBROADCASTD X2, Z2
	VMOVDQU32 mxpat<>+32(SB), Z10
	VPMULLD Z2, Z10, Z10
	MOVL $0xffff, AX
	KMOVW AX, K1

tcblk:
	KMOVW K1, K2
	VPGATHERDD 0(SI)(Z10*1), K2, Z0
	KMOVW K1, K3
	VPGATHERDD 4(SI)(Z10*1), K3, Z1
	KMOVW K1, K4
	VPGATHERDD 8(SI)(Z10*1), K4, Z3
	KMOVW K1, K5
	VPGATHERDD 12(SI)(Z10*1), K5, Z4
	VMOVDQU32 Z0, 0(DI)
	VMOVDQU32 Z1, 64(DI)
	VMOVDQU32 Z3, 128(DI)
	VMOVDQU32 Z4, 192(DI)
	ADDQ $16, SI
	ADDQ $256, DI
	DECQ R8
	JNZ  tcblk

tcdone:
	VZEROUPPER
	RET

// Dwords 0,2,4,6 then 1,3,5,7 of each 32 bytes: mxPermX's order (even and
// odd values of each dword interleaved) to mxPermRows' (the four even
// dwords of a block, then the four odd).
DATA mxrows<>+0(SB)/4, $0
DATA mxrows<>+4(SB)/4, $2
DATA mxrows<>+8(SB)/4, $4
DATA mxrows<>+12(SB)/4, $6
DATA mxrows<>+16(SB)/4, $1
DATA mxrows<>+20(SB)/4, $3
DATA mxrows<>+24(SB)/4, $5
DATA mxrows<>+28(SB)/4, $7
DATA mxrows<>+32(SB)/4, $8
DATA mxrows<>+36(SB)/4, $10
DATA mxrows<>+40(SB)/4, $12
DATA mxrows<>+44(SB)/4, $14
DATA mxrows<>+48(SB)/4, $9
DATA mxrows<>+52(SB)/4, $11
DATA mxrows<>+56(SB)/4, $13
DATA mxrows<>+60(SB)/4, $15
GLOBL mxrows<>(SB), RODATA|NOPTR, $64

// mxPermRowsAVX512(xq *int8, nblk int) reorders, in place, activations
// mxPrepXAVX512 permuted, into mxPermRows' order; nblk is even.
TEXT ·mxPermRowsAVX512(SB), NOSPLIT, $0-16
	MOVQ xq+0(FP), DI
	MOVQ nblk+8(FP), CX
	TESTQ CX, CX
	JLE  prdone
	VMOVDQU32 mxrows<>+0(SB), Z1

prloop:
	VPERMD (DI), Z1, Z0
	VMOVDQU32 Z0, (DI)
	ADDQ $64, DI
	SUBQ $2, CX
	JGT  prloop

prdone:
	VZEROUPPER
	RET

// R16LOAD fills Z register z with the block's 16 code bytes of rows k,
// k+4, k+8 and k+12 (one a 128-bit lane): rows 0, 4, 8 and 12 are at
// (SI), (R9), (R10), (R11), and row k is idx past row 0; R16LOAD0 is k = 0.
#define R16LOAD(idx, z, x) \
	VMOVDQU32 (SI)(idx), x \
	VINSERTI32X4 $1, (R9)(idx), z, z \
	VINSERTI32X4 $2, (R10)(idx), z, z \
	VINSERTI32X4 $3, (R11)(idx), z, z

#define R16LOAD0(z, x) \
	VMOVDQU32 (SI), x \
	VINSERTI32X4 $1, (R9), z, z \
	VINSERTI32X4 $2, (R10), z, z \
	VINSERTI32X4 $3, (R11), z, z


// R16DOT adds the codes of z times the activations' even (Z20) and odd
// (Z21) dwords, lane by lane, into acc.
#define R16DOT(z, t, acc) \
	VPSRLW $4, z, t \
	VPANDD Z9, z, z \
	VPANDD Z9, t, t \
	VPSHUFB z, Z15, z \
	VPSHUFB t, Z15, t \
	VPXORD acc, acc, acc \
	VPDPBUSD Z20, z, acc \
	VPDPBUSD Z21, t, acc

// R16BLK adds one block of the 16 rows to Z22: the codes at (SI) and the
// other rows' pointers, activations at x(AX), 12·Σx8 at s(BX), scale
// bytes gathered from (DI) (one dword a row, its low byte), xs in Z8.
#define R16BLK(x, s) \
	R16LOAD0(Z0, X0) \
	R16LOAD(R12*1, Z1, X1) \
	R16LOAD(R12*2, Z2, X2) \
	R16LOAD(R13*1, Z3, X3) \
	VBROADCASTI32X4 x(AX), Z20 \
	VBROADCASTI32X4 x+16(AX), Z21 \
	R16DOT(Z0, Z4, Z16) \
	R16DOT(Z1, Z5, Z17) \
	R16DOT(Z2, Z6, Z18) \
	R16DOT(Z3, Z7, Z19) \
	VPUNPCKLDQ Z17, Z16, Z4 \
	VPUNPCKHDQ Z17, Z16, Z5 \
	VPADDD Z5, Z4, Z4 \
	VPUNPCKLDQ Z19, Z18, Z6 \
	VPUNPCKHDQ Z19, Z18, Z7 \
	VPADDD Z7, Z6, Z6 \
	VPUNPCKLQDQ Z6, Z4, Z5 \
	VPUNPCKHQDQ Z6, Z4, Z7 \
	VPADDD Z7, Z5, Z5 \
	VPSUBD.BCST s(BX), Z5, Z5 \
	VCVTDQ2PS Z5, Z5 \
	KMOVW K1, K2 \
	VPXORD Z6, Z6, Z6 \
	VPGATHERDD (DI)(Z11*1), K2, Z6 \
	VPANDD Z12, Z6, Z6 \
	VPSUBD Z10, Z6, Z6 \
	VCVTDQ2PS Z6, Z6 \
	VSCALEFPS Z6, Z8, Z6 \
	VMULPS Z6, Z5, Z5 \
	VADDPS Z5, Z22, Z22 \
	ADDQ $16, SI \
	ADDQ $16, R9 \
	ADDQ $16, R10 \
	ADDQ $16, R11 \
	INCQ DI

// mxfp4Rows16(q, e8 *byte, nblk, ntiles int, xq *int8, sx12 *int32, xs *float32, out *float32)
//
// The decode kernel of row-major MXFP4 weights, 16 rows at a time: row r
// of a group of 16 ends in lane r, as in the tiled kernel. Each Z register
// holds one block of four rows (k, k+4, k+8, k+12, a 128-bit lane each),
// VPDPBUSD multiplies each lane's four code dwords by the activations'
// matching dwords (mxPermRows' order, broadcast to every lane), and a
// transposing add of the four registers leaves each row's block sum in
// its lane. The scale bytes come by a gather of one dword a row, which
// reads up to three bytes past the group's last row's: the caller passes
// no group that ends a matrix. The float part is the tiled kernel's.
TEXT ·mxfp4Rows16(SB), NOSPLIT, $0-64
	MOVQ nblk+16(FP), R8
	MOVQ ntiles+24(FP), R14
	TESTQ R14, R14
	JLE  r16done
	TESTQ R8, R8
	JLE  r16done
	MOVQ q+0(FP), SI
	MOVQ e8+8(FP), DI
	MOVQ out+56(FP), DX
	MOVQ R8, R12
	SHLQ $4, R12          // a row's code bytes: 16 a block
	LEAQ (R12)(R12*2), R13
	VBROADCASTI32X4 mxlut<>+16(SB), Z15
	BCASTD($0x0f0f0f0f, X9, Z9)
	BCASTD($128, X10, Z10)
	BCASTD($0xff, X12, Z12)
	VMOVD R8, X11
	VPBROADCASTD X11, Z13
	VMOVDQU32 mxpat<>+32(SB), Z11
	VPMULLD Z13, Z11, Z11
	MOVL $0xffff, AX
	KMOVW AX, K1

r16tile:
	LEAQ (SI)(R12*4), R9
	LEAQ (R9)(R12*4), R10
	LEAQ (R10)(R12*4), R11
	// R15 walks the next group of 16 rows (16·R12 bytes on), 512 bytes
	// a pair of blocks: its whole 16 rows once this group's are done,
	// read in one sequence.
	LEAQ (SI)(R12*8), R15
	LEAQ (R15)(R12*8), R15
	MOVQ xq+32(FP), AX
	MOVQ sx12+40(FP), BX
	MOVQ xs+48(FP), CX
	MOVQ nblk+16(FP), R8
	VXORPS Z22, Z22, Z22

r16pair:
	PF8LINES(R15)
	ADDQ $512, R15
	VBROADCASTSS (CX), Z8
	R16BLK(0, 0)
	R16BLK(32, 4)
	ADDQ $64, AX
	ADDQ $8, BX
	ADDQ $4, CX
	SUBQ $2, R8
	JGT  r16pair

	VMOVUPS Z22, (DX)
	ADDQ $64, DX
	// SI and DI have passed one row: on to the next group's first row
	// (DI: 15 rows of nblk scale bytes, R12 - nblk).
	LEAQ (SI)(R13*4), SI
	ADDQ R13, SI
	ADDQ R12, DI
	SUBQ nblk+16(FP), DI
	DECQ R14
	JNZ  r16tile

r16done:
	VZEROUPPER
	RET
