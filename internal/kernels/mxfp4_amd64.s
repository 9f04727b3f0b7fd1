//go:build amd64

#include "textflag.h"

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
