//go:build amd64

#include "textflag.h"

// Horizontal sum of Y0 into X0 (lane order fixed, so results are
// reproducible).
#define HSUM_Y0 \
	VEXTRACTF128 $1, Y0, X1 \
	VADDPS       X1, X0, X0 \
	VHADDPS      X0, X0, X0 \
	VHADDPS      X0, X0, X0

// ZERO4 clears four vector registers, the chains a loop accumulates into.
#define ZERO4(a, b, c, d) \
	VXORPS a, a, a \
	VXORPS b, b, b \
	VXORPS c, c, c \
	VXORPS d, d, d

// func dotQ4AVX2(q *byte, scales, biases, x, xsum *float32, ng int) float32
// Per group: 32 bytes hold q[j] (low nibble) and q[j+32] (high nibble).
// VPMOVZXBD widens 8 bytes to 8 int32 lanes; the low nibbles are elements
// j..j+7 and the high nibbles j+32..j+39 of the same load.
TEXT ·dotQ4AVX2(SB), NOSPLIT, $0-52
	MOVQ q+0(FP), SI
	MOVQ scales+8(FP), R8
	MOVQ biases+16(FP), R9
	MOVQ x+24(FP), DI
	MOVQ xsum+32(FP), R10
	MOVQ ng+40(FP), CX
	VXORPS Y0, Y0, Y0          // total
	VXORPS X9, X9, X9          // Σ bias·xsum
	VPCMPEQD Y15, Y15, Y15
	VPSRLD $28, Y15, Y15       // 0x0000000F per lane
	TESTQ CX, CX
	JEQ q4done
q4loop:
	ZERO4(Y4, Y5, Y10, Y11)
	VPMOVZXBD 0(SI), Y1
	VPAND Y15, Y1, Y2
	VPSRLD $4, Y1, Y3
	VCVTDQ2PS Y2, Y2
	VCVTDQ2PS Y3, Y3
	VFMADD231PS 0(DI), Y2, Y4
	VFMADD231PS 128(DI), Y3, Y5
	VPMOVZXBD 8(SI), Y1
	VPAND Y15, Y1, Y2
	VPSRLD $4, Y1, Y3
	VCVTDQ2PS Y2, Y2
	VCVTDQ2PS Y3, Y3
	VFMADD231PS 32(DI), Y2, Y10
	VFMADD231PS 160(DI), Y3, Y11
	VPMOVZXBD 16(SI), Y1
	VPAND Y15, Y1, Y2
	VPSRLD $4, Y1, Y3
	VCVTDQ2PS Y2, Y2
	VCVTDQ2PS Y3, Y3
	VFMADD231PS 64(DI), Y2, Y4
	VFMADD231PS 192(DI), Y3, Y5
	VPMOVZXBD 24(SI), Y1
	VPAND Y15, Y1, Y2
	VPSRLD $4, Y1, Y3
	VCVTDQ2PS Y2, Y2
	VCVTDQ2PS Y3, Y3
	VFMADD231PS 96(DI), Y2, Y10
	VFMADD231PS 224(DI), Y3, Y11
	VADDPS Y4, Y10, Y4
	VADDPS Y5, Y11, Y5
	VADDPS Y4, Y5, Y6
	VBROADCASTSS (R8), Y7
	VFMADD231PS Y7, Y6, Y0
	VMOVSS (R9), X8
	VMULSS (R10), X8, X8
	VADDSS X8, X9, X9
	ADDQ $32, SI
	ADDQ $256, DI
	ADDQ $4, R8
	ADDQ $4, R9
	ADDQ $4, R10
	DECQ CX
	JNE q4loop
q4done:
	HSUM_Y0
	VADDSS X9, X0, X0
	VZEROUPPER
	MOVSS X0, ret+48(FP)
	RET

// func dotQ8AVX2(q *byte, scales, biases, x, xsum *float32, ng int) float32
TEXT ·dotQ8AVX2(SB), NOSPLIT, $0-52
	MOVQ q+0(FP), SI
	MOVQ scales+8(FP), R8
	MOVQ biases+16(FP), R9
	MOVQ x+24(FP), DI
	MOVQ xsum+32(FP), R10
	MOVQ ng+40(FP), CX
	VXORPS Y0, Y0, Y0
	VXORPS X9, X9, X9
	TESTQ CX, CX
	JEQ q8done
q8loop:
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VPMOVZXBD 0(SI), Y1
	VCVTDQ2PS Y1, Y1
	VFMADD231PS 0(DI), Y1, Y4
	VPMOVZXBD 8(SI), Y2
	VCVTDQ2PS Y2, Y2
	VFMADD231PS 32(DI), Y2, Y5
	VPMOVZXBD 16(SI), Y1
	VCVTDQ2PS Y1, Y1
	VFMADD231PS 64(DI), Y1, Y4
	VPMOVZXBD 24(SI), Y2
	VCVTDQ2PS Y2, Y2
	VFMADD231PS 96(DI), Y2, Y5
	VPMOVZXBD 32(SI), Y1
	VCVTDQ2PS Y1, Y1
	VFMADD231PS 128(DI), Y1, Y4
	VPMOVZXBD 40(SI), Y2
	VCVTDQ2PS Y2, Y2
	VFMADD231PS 160(DI), Y2, Y5
	VPMOVZXBD 48(SI), Y1
	VCVTDQ2PS Y1, Y1
	VFMADD231PS 192(DI), Y1, Y4
	VPMOVZXBD 56(SI), Y2
	VCVTDQ2PS Y2, Y2
	VFMADD231PS 224(DI), Y2, Y5
	VADDPS Y4, Y5, Y6
	VBROADCASTSS (R8), Y7
	VFMADD231PS Y7, Y6, Y0
	VMOVSS (R9), X8
	VMULSS (R10), X8, X8
	VADDSS X8, X9, X9
	ADDQ $64, SI
	ADDQ $256, DI
	ADDQ $4, R8
	ADDQ $4, R9
	ADDQ $4, R10
	DECQ CX
	JNE q8loop
q8done:
	HSUM_Y0
	VADDSS X9, X0, X0
	VZEROUPPER
	MOVSS X0, ret+48(FP)
	RET

// func dotBF16AVX2(w *uint16, x *float32, n int) float32
// bf16 → f32 is a 16-bit shift of the widened word.
TEXT ·dotBF16AVX2(SB), NOSPLIT, $0-28
	MOVQ w+0(FP), SI
	MOVQ x+8(FP), DI
	MOVQ n+16(FP), CX
	SHRQ $4, CX
	VXORPS Y0, Y0, Y0
	VXORPS Y4, Y4, Y4
	TESTQ CX, CX
	JEQ bfdone
bfloop:
	VPMOVZXWD 0(SI), Y1
	VPSLLD $16, Y1, Y1
	VFMADD231PS 0(DI), Y1, Y0
	VPMOVZXWD 16(SI), Y2
	VPSLLD $16, Y2, Y2
	VFMADD231PS 32(DI), Y2, Y4
	ADDQ $32, SI
	ADDQ $64, DI
	DECQ CX
	JNE bfloop
bfdone:
	VADDPS Y4, Y0, Y0
	HSUM_Y0
	VZEROUPPER
	MOVSS X0, ret+24(FP)
	RET

// func dotF32AVX2(w, x *float32, n int) float32
TEXT ·dotF32AVX2(SB), NOSPLIT, $0-28
	MOVQ w+0(FP), SI
	MOVQ x+8(FP), DI
	MOVQ n+16(FP), CX
	SHRQ $4, CX
	VXORPS Y0, Y0, Y0
	VXORPS Y4, Y4, Y4
	TESTQ CX, CX
	JEQ f32done
f32loop:
	VMOVUPS 0(SI), Y1
	VFMADD231PS 0(DI), Y1, Y0
	VMOVUPS 32(SI), Y2
	VFMADD231PS 32(DI), Y2, Y4
	ADDQ $64, SI
	ADDQ $64, DI
	DECQ CX
	JNE f32loop
f32done:
	VADDPS Y4, Y0, Y0
	HSUM_Y0
	VZEROUPPER
	MOVSS X0, ret+24(FP)
	RET

// func dotQ4I8AVX2(q *byte, scales, biases *float32, x8 *int8, xs, xsum *float32, ng int) float32
// The integer design for one weight row and one activation row, in
// dotQ4I8's arithmetic: VPMADDUBSW multiplies the unsigned nibbles by the
// signed activations into int16 pairs (at most 2·15·127 per pair, no
// saturation), VPMADDWD widens to int32, and the group's exact integer sum
// goes through the float steps one at a time. The tile kernels
// (q4tile_*_amd64.s) compute the same thing for many rows at once.
TEXT ·dotQ4I8AVX2(SB), NOSPLIT, $0-60
	MOVQ q+0(FP), SI
	MOVQ scales+8(FP), R8
	MOVQ biases+16(FP), R9
	MOVQ x8+24(FP), DI
	MOVQ xs+32(FP), R11
	MOVQ xsum+40(FP), R10
	MOVQ ng+48(FP), CX
	VXORPS X0, X0, X0
	VPCMPEQW Y14, Y14, Y14
	VPSRLW $15, Y14, Y14       // 1 per int16 lane
	VPCMPEQB Y15, Y15, Y15
	VPSRLW $12, Y15, Y15       // 0x000F per int16 lane
	VPACKUSWB Y15, Y15, Y15    // 0x0F per byte
	TESTQ CX, CX
	JEQ i8done
i8loop:
	VMOVDQU (SI), Y1
	VPAND Y15, Y1, Y2
	VPSRLW $4, Y1, Y3
	VPAND Y15, Y3, Y3
	VPMADDUBSW 0(DI), Y2, Y2
	VPMADDUBSW 32(DI), Y3, Y3
	VPADDW Y2, Y3, Y2
	VPMADDWD Y14, Y2, Y2
	VEXTRACTI128 $1, Y2, X3
	VPADDD X3, X2, X2
	VPSHUFD $0x4e, X2, X3
	VPADDD X3, X2, X2
	VPSHUFD $0xb1, X2, X3
	VPADDD X3, X2, X2          // s, exact
	VCVTDQ2PS X2, X2
	VMOVSS (R8), X7
	VMULSS (R11), X7, X7       // scale·xs
	VMULSS X7, X2, X2          // s·(scale·xs)
	VMOVSS (R9), X8
	VMULSS (R10), X8, X8       // bias·xsum
	VADDSS X8, X2, X2
	VADDSS X2, X0, X0
	ADDQ $32, SI
	ADDQ $64, DI
	ADDQ $4, R8
	ADDQ $4, R9
	ADDQ $4, R10
	ADDQ $4, R11
	DECQ CX
	JNE i8loop
i8done:
	VZEROUPPER
	MOVSS X0, ret+56(FP)
	RET

// func axpyAVX2(y *float32, a float32, x *float32, n int)
// y += a·x for n a multiple of 16.
TEXT ·axpyAVX2(SB), NOSPLIT, $0-32
	MOVQ y+0(FP), DI
	VBROADCASTSS a+8(FP), Y7
	MOVQ x+16(FP), SI
	MOVQ n+24(FP), CX
	SHRQ $4, CX
	TESTQ CX, CX
	JEQ axdone
axloop:
	VMOVUPS 0(DI), Y0
	VMOVUPS 32(DI), Y1
	VFMADD231PS 0(SI), Y7, Y0
	VFMADD231PS 32(SI), Y7, Y1
	VMOVUPS Y0, 0(DI)
	VMOVUPS Y1, 32(DI)
	ADDQ $64, SI
	ADDQ $64, DI
	DECQ CX
	JNE axloop
axdone:
	VZEROUPPER
	RET

// func deltaRuleAVX2(S, k, q, v, kv, o *float32, decay, beta float32, dk, dv int)
// One gated delta-rule step for one value head, S [dk][dv] row-major:
//   S = decay·S; kv = Sᵀk; kv = beta·(v − kv); S += k⊗kv; o = Sᵀq.
// dv must be a multiple of 8. kv is scratch of dv floats.
TEXT ·deltaRuleAVX2(SB), NOSPLIT, $0-72
	MOVQ S+0(FP), SI
	MOVQ k+8(FP), R8
	MOVQ q+16(FP), R9
	MOVQ v+24(FP), R10
	MOVQ kv+32(FP), R11
	MOVQ o+40(FP), R12
	VBROADCASTSS decay+48(FP), Y14
	VBROADCASTSS beta+52(FP), Y15
	MOVQ dk+56(FP), CX
	MOVQ dv+64(FP), DX
	SHRQ $3, DX                // 8-float chunks per row
	// kv = 0, o = 0
	VXORPS Y0, Y0, Y0
	MOVQ DX, BX
	XORQ AX, AX
dzero:
	VMOVUPS Y0, (R11)(AX*1)
	VMOVUPS Y0, (R12)(AX*1)
	ADDQ $32, AX
	DECQ BX
	JNE dzero
	// pass 1: S *= decay; kv += S[a]·k[a]
	MOVQ SI, DI
	MOVQ R8, R13
	MOVQ CX, R14
dp1row:
	VBROADCASTSS (R13), Y1
	MOVQ DX, BX
	XORQ AX, AX
dp1col:
	VMULPS (DI)(AX*1), Y14, Y2
	VMOVUPS Y2, (DI)(AX*1)
	VMOVUPS (R11)(AX*1), Y3
	VFMADD231PS Y2, Y1, Y3
	VMOVUPS Y3, (R11)(AX*1)
	ADDQ $32, AX
	DECQ BX
	JNE dp1col
	MOVQ DX, AX
	SHLQ $5, AX
	ADDQ AX, DI
	ADDQ $4, R13
	DECQ R14
	JNE dp1row
	// kv = beta·(v − kv)
	MOVQ DX, BX
	XORQ AX, AX
dmid:
	VMOVUPS (R10)(AX*1), Y2
	VSUBPS (R11)(AX*1), Y2, Y2
	VMULPS Y15, Y2, Y2
	VMOVUPS Y2, (R11)(AX*1)
	ADDQ $32, AX
	DECQ BX
	JNE dmid
	// pass 2: S[a] += k[a]·kv; o += S[a]·q[a]
	MOVQ SI, DI
	MOVQ R8, R13
	MOVQ R9, R15
	MOVQ CX, R14
dp2row:
	VBROADCASTSS (R13), Y1
	VBROADCASTSS (R15), Y4
	MOVQ DX, BX
	XORQ AX, AX
dp2col:
	VMOVUPS (DI)(AX*1), Y2
	VFMADD231PS (R11)(AX*1), Y1, Y2
	VMOVUPS Y2, (DI)(AX*1)
	VMOVUPS (R12)(AX*1), Y3
	VFMADD231PS Y2, Y4, Y3
	VMOVUPS Y3, (R12)(AX*1)
	ADDQ $32, AX
	DECQ BX
	JNE dp2col
	MOVQ DX, AX
	SHLQ $5, AX
	ADDQ AX, DI
	ADDQ $4, R13
	ADDQ $4, R15
	DECQ R14
	JNE dp2row
	VZEROUPPER
	RET

// func scoresAVX2(q, k *float32, stride, n, hd int, scale float32, out *float32)
// out[j] = scale·(q·k_j) for n keys stride bytes apart; hd a multiple of 16.
// Per key the arithmetic is dotF32AVX2's, so a score equals Dot(q,k)·scale.
TEXT ·scoresAVX2(SB), NOSPLIT, $0-56
	MOVQ q+0(FP), SI
	MOVQ k+8(FP), DI
	MOVQ stride+16(FP), R8
	MOVQ n+24(FP), R9
	MOVQ hd+32(FP), R10
	SHRQ $4, R10
	VMOVSS scale+40(FP), X6
	MOVQ out+48(FP), R11
	LEAQ (R8)(R8*2), R12            // 3·stride
	// Blocks of four keys share each load of q; their horizontal sums are
	// one VHADDPS tree whose additions per key are exactly HSUM_Y0's, so
	// every score is bit-identical to the one-key loop's.
sc4:
	CMPQ R9, $4
	JLT sckey
	ZERO4(Y8, Y9, Y10, Y11)
	ZERO4(Y12, Y13, Y14, Y15)
	MOVQ R10, CX
	XORQ AX, AX
	MOVQ DI, BX
sc4dim:
	VMOVUPS 0(SI)(AX*1), Y1
	VMOVUPS 32(SI)(AX*1), Y2
	VFMADD231PS 0(BX), Y1, Y8
	VFMADD231PS 32(BX), Y2, Y9
	VFMADD231PS 0(BX)(R8*1), Y1, Y10
	VFMADD231PS 32(BX)(R8*1), Y2, Y11
	VFMADD231PS 0(BX)(R8*2), Y1, Y12
	VFMADD231PS 32(BX)(R8*2), Y2, Y13
	VFMADD231PS 0(BX)(R12*1), Y1, Y14
	VFMADD231PS 32(BX)(R12*1), Y2, Y15
	ADDQ $64, AX
	ADDQ $64, BX
	DECQ CX
	JNE sc4dim
	VADDPS Y9, Y8, Y8
	VADDPS Y11, Y10, Y10
	VADDPS Y13, Y12, Y12
	VADDPS Y15, Y14, Y14
	VEXTRACTF128 $1, Y8, X1
	VADDPS X1, X8, X8
	VEXTRACTF128 $1, Y10, X1
	VADDPS X1, X10, X10
	VEXTRACTF128 $1, Y12, X1
	VADDPS X1, X12, X12
	VEXTRACTF128 $1, Y14, X1
	VADDPS X1, X14, X14
	VHADDPS X10, X8, X8             // [a01 a23 b01 b23]
	VHADDPS X14, X12, X12           // [c01 c23 d01 d23]
	VHADDPS X12, X8, X8             // [a b c d]
	VBROADCASTSS X6, X7
	VMULPS X7, X8, X8
	VMOVUPS X8, (R11)
	ADDQ $16, R11
	LEAQ (DI)(R8*4), DI
	SUBQ $4, R9
	JMP sc4
sckey:
	TESTQ R9, R9
	JEQ scdone
	VXORPS Y0, Y0, Y0
	VXORPS Y4, Y4, Y4
	MOVQ R10, CX
	XORQ AX, AX
scdim:
	VMOVUPS 0(SI)(AX*1), Y1
	VFMADD231PS 0(DI)(AX*1), Y1, Y0
	VMOVUPS 32(SI)(AX*1), Y2
	VFMADD231PS 32(DI)(AX*1), Y2, Y4
	ADDQ $64, AX
	DECQ CX
	JNE scdim
	VADDPS Y4, Y0, Y0
	HSUM_Y0
	VMULSS X6, X0, X0
	VMOVSS X0, (R11)
	ADDQ $4, R11
	ADDQ R8, DI
	DECQ R9
	JMP sckey
scdone:
	VZEROUPPER
	RET

// SCORE3 reduces one (head, key) pair's two chains a and b (xa, xb their
// low halves) as dotF32AVX2 and HSUM_Y0 do, scales it by sc (a memory
// operand) and stores it.
#define SCORE3(a, b, xa, xb, sc, dst) \
	VADDPS b, a, a \
	VEXTRACTF128 $1, a, xb \
	VADDPS xb, xa, xa \
	VHADDPS xa, xa, xa \
	VHADDPS xa, xa, xa \
	VMULSS sc, xa, xa \
	VMOVSS xa, dst

// func scores3AVX2(q *float32, qStride int, k *float32, stride, n, hd int, scale float32, out *float32, outStride int)
// scoresAVX2 for three queries qStride bytes apart over the same keys,
// out rows outStride bytes apart: each pair of keys is loaded once for
// the three (twelve chains in flight), and each score's arithmetic is
// dotF32AVX2's, so the scores are scoresAVX2's bits.
TEXT ·scores3AVX2(SB), NOSPLIT, $0-72
	MOVQ q+0(FP), SI
	MOVQ qStride+8(FP), R13
	MOVQ k+16(FP), DI
	MOVQ stride+24(FP), R8
	MOVQ n+32(FP), R9
	MOVQ hd+40(FP), R10
	SHRQ $4, R10
	MOVQ out+56(FP), R11
	MOVQ outStride+64(FP), R12
	LEAQ (SI)(R13*1), DX
	LEAQ (SI)(R13*2), R14
s3pair:
	CMPQ R9, $2
	JLT s3one
	ZERO4(Y4, Y5, Y6, Y7)
	ZERO4(Y8, Y9, Y10, Y11)
	ZERO4(Y12, Y13, Y14, Y15)
	MOVQ R10, CX
	XORQ AX, AX
	MOVQ DI, BX
s3dim:
	VMOVUPS 0(BX), Y0
	VMOVUPS 32(BX), Y1
	VMOVUPS 0(BX)(R8*1), Y2
	VMOVUPS 32(BX)(R8*1), Y3
	VFMADD231PS 0(SI)(AX*1), Y0, Y4
	VFMADD231PS 32(SI)(AX*1), Y1, Y5
	VFMADD231PS 0(SI)(AX*1), Y2, Y6
	VFMADD231PS 32(SI)(AX*1), Y3, Y7
	VFMADD231PS 0(DX)(AX*1), Y0, Y8
	VFMADD231PS 32(DX)(AX*1), Y1, Y9
	VFMADD231PS 0(DX)(AX*1), Y2, Y10
	VFMADD231PS 32(DX)(AX*1), Y3, Y11
	VFMADD231PS 0(R14)(AX*1), Y0, Y12
	VFMADD231PS 32(R14)(AX*1), Y1, Y13
	VFMADD231PS 0(R14)(AX*1), Y2, Y14
	VFMADD231PS 32(R14)(AX*1), Y3, Y15
	ADDQ $64, AX
	ADDQ $64, BX
	DECQ CX
	JNE s3dim
	SCORE3(Y4, Y5, X4, X5, scale+48(FP), (R11))
	SCORE3(Y6, Y7, X6, X7, scale+48(FP), 4(R11))
	SCORE3(Y8, Y9, X8, X9, scale+48(FP), (R11)(R12*1))
	SCORE3(Y10, Y11, X10, X11, scale+48(FP), 4(R11)(R12*1))
	SCORE3(Y12, Y13, X12, X13, scale+48(FP), (R11)(R12*2))
	SCORE3(Y14, Y15, X14, X15, scale+48(FP), 4(R11)(R12*2))
	ADDQ $8, R11
	LEAQ (DI)(R8*2), DI
	SUBQ $2, R9
	JMP s3pair
s3one:
	TESTQ R9, R9
	JEQ s3done
	ZERO4(Y4, Y5, Y8, Y9)
	VXORPS Y12, Y12, Y12
	VXORPS Y13, Y13, Y13
	MOVQ R10, CX
	XORQ AX, AX
s3onedim:
	VMOVUPS 0(DI)(AX*1), Y0
	VMOVUPS 32(DI)(AX*1), Y1
	VFMADD231PS 0(SI)(AX*1), Y0, Y4
	VFMADD231PS 32(SI)(AX*1), Y1, Y5
	VFMADD231PS 0(DX)(AX*1), Y0, Y8
	VFMADD231PS 32(DX)(AX*1), Y1, Y9
	VFMADD231PS 0(R14)(AX*1), Y0, Y12
	VFMADD231PS 32(R14)(AX*1), Y1, Y13
	ADDQ $64, AX
	DECQ CX
	JNE s3onedim
	SCORE3(Y4, Y5, X4, X5, scale+48(FP), (R11))
	SCORE3(Y8, Y9, X8, X9, scale+48(FP), (R11)(R12*1))
	SCORE3(Y12, Y13, X12, X13, scale+48(FP), (R11)(R12*2))
s3done:
	VZEROUPPER
	RET

// MIXLOAD8, MIXFMA8 and MIXSTORE8 are a pass of mixAccAVX2 over 8
// registers of W bytes (Y or Z): the chains loaded from o at DI, one key's
// value row at BX times the broadcast weight P added in, the chains
// stored back.
#define MIXLOAD8(W, R0, R1, R2, R3, R4, R5, R6, R7) \
	VMOVUPS (0*W)(DI), R0 \
	VMOVUPS (1*W)(DI), R1 \
	VMOVUPS (2*W)(DI), R2 \
	VMOVUPS (3*W)(DI), R3 \
	VMOVUPS (4*W)(DI), R4 \
	VMOVUPS (5*W)(DI), R5 \
	VMOVUPS (6*W)(DI), R6 \
	VMOVUPS (7*W)(DI), R7

#define MIXFMA8(W, P, R0, R1, R2, R3, R4, R5, R6, R7) \
	VFMADD231PS (0*W)(BX), P, R0 \
	VFMADD231PS (1*W)(BX), P, R1 \
	VFMADD231PS (2*W)(BX), P, R2 \
	VFMADD231PS (3*W)(BX), P, R3 \
	VFMADD231PS (4*W)(BX), P, R4 \
	VFMADD231PS (5*W)(BX), P, R5 \
	VFMADD231PS (6*W)(BX), P, R6 \
	VFMADD231PS (7*W)(BX), P, R7

#define MIXSTORE8(W, R0, R1, R2, R3, R4, R5, R6, R7) \
	VMOVUPS R0, (0*W)(DI) \
	VMOVUPS R1, (1*W)(DI) \
	VMOVUPS R2, (2*W)(DI) \
	VMOVUPS R3, (3*W)(DI) \
	VMOVUPS R4, (4*W)(DI) \
	VMOVUPS R5, (5*W)(DI) \
	VMOVUPS R6, (6*W)(DI) \
	VMOVUPS R7, (7*W)(DI)

// func mixAccAVX2(o, v *float32, stride, n, hd int, p *float32)
// o += Σ_j p[j]·v_j over n values stride bytes apart, in j order: each
// element continues its FMA chain (the chain Axpy would compute) from o's
// value, so that a run of blocks of rows gives one call's bits; hd a
// multiple of 32.
TEXT ·mixAccAVX2(SB), NOSPLIT, $0-48
	MOVQ o+0(FP), DI
	MOVQ v+8(FP), SI
	MOVQ stride+16(FP), R8
	MOVQ n+24(FP), R9
	MOVQ hd+32(FP), R10
	SHRQ $5, R10
	MOVQ p+40(FP), R11
	// 64 elements a pass while they last: eight chains in flight rather
	// than four, where four left the FMA units waiting on each chain's
	// latency; each element's chain is the same either way. Where 512-bit
	// operations run at full width (mixZMM), 128 elements a pass on Z
	// registers first.
	CMPB ·mixZMM(SB), $0
	JEQ mac64
mac128:
	CMPQ R10, $4
	JLT mac64
	MIXLOAD8(64, Z0, Z1, Z2, Z3, Z4, Z5, Z6, Z8)
	MOVQ SI, BX
	MOVQ R11, DX
	MOVQ R9, CX
	TESTQ CX, CX
	JEQ mac128store
mac128key:
	VBROADCASTSS (DX), Z7
	MIXFMA8(64, Z7, Z0, Z1, Z2, Z3, Z4, Z5, Z6, Z8)
	ADDQ $4, DX
	ADDQ R8, BX
	DECQ CX
	JNE mac128key
mac128store:
	MIXSTORE8(64, Z0, Z1, Z2, Z3, Z4, Z5, Z6, Z8)
	ADDQ $512, DI
	ADDQ $512, SI
	SUBQ $4, R10
	JNE mac128
	VZEROUPPER
	RET
mac64:
	CMPQ R10, $2
	JLT macchunk
	MIXLOAD8(32, Y0, Y1, Y2, Y3, Y4, Y5, Y6, Y8)
	MOVQ SI, BX
	MOVQ R11, DX
	MOVQ R9, CX
	TESTQ CX, CX
	JEQ mac64store
mac64key:
	VBROADCASTSS (DX), Y7
	MIXFMA8(32, Y7, Y0, Y1, Y2, Y3, Y4, Y5, Y6, Y8)
	ADDQ $4, DX
	ADDQ R8, BX
	DECQ CX
	JNE mac64key
mac64store:
	MIXSTORE8(32, Y0, Y1, Y2, Y3, Y4, Y5, Y6, Y8)
	ADDQ $256, DI
	ADDQ $256, SI
	SUBQ $2, R10
	JNE mac64
	VZEROUPPER
	RET
macchunk:
	VMOVUPS 0(DI), Y0
	VMOVUPS 32(DI), Y1
	VMOVUPS 64(DI), Y2
	VMOVUPS 96(DI), Y3
	MOVQ SI, BX
	MOVQ R11, DX
	MOVQ R9, CX
	TESTQ CX, CX
	JEQ macstore
mackey:
	VBROADCASTSS (DX), Y7
	VFMADD231PS 0(BX), Y7, Y0
	VFMADD231PS 32(BX), Y7, Y1
	VFMADD231PS 64(BX), Y7, Y2
	VFMADD231PS 96(BX), Y7, Y3
	ADDQ $4, DX
	ADDQ R8, BX
	DECQ CX
	JNE mackey
macstore:
	VMOVUPS Y0, 0(DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	VMOVUPS Y3, 96(DI)
	ADDQ $128, DI
	ADDQ $128, SI
	DECQ R10
	JNE macchunk
	VZEROUPPER
	RET

// func mixAcc2AVX2(o1, o2, v *float32, stride, n, hd int, p1, p2 *float32)
// mixAccAVX2 for two heads over the same value rows: each row's chunk is
// loaded once for both, and the two heads' eight chains run side by side.
// Each element's chain is mixAccAVX2's.
TEXT ·mixAcc2AVX2(SB), NOSPLIT, $0-64
	MOVQ o1+0(FP), DI
	MOVQ o2+8(FP), R12
	MOVQ v+16(FP), SI
	MOVQ stride+24(FP), R8
	MOVQ n+32(FP), R9
	MOVQ hd+40(FP), R10
	SHRQ $5, R10
	MOVQ p1+48(FP), R11
	MOVQ p2+56(FP), R13
m2chunk:
	VMOVUPS 0(DI), Y0
	VMOVUPS 32(DI), Y1
	VMOVUPS 64(DI), Y2
	VMOVUPS 96(DI), Y3
	VMOVUPS 0(R12), Y4
	VMOVUPS 32(R12), Y5
	VMOVUPS 64(R12), Y6
	VMOVUPS 96(R12), Y7
	MOVQ SI, BX
	MOVQ R11, DX
	MOVQ R13, R14
	MOVQ R9, CX
	TESTQ CX, CX
	JEQ m2store
m2key:
	VBROADCASTSS (DX), Y8
	VBROADCASTSS (R14), Y9
	VMOVUPS 0(BX), Y10
	VMOVUPS 32(BX), Y11
	VMOVUPS 64(BX), Y12
	VMOVUPS 96(BX), Y13
	VFMADD231PS Y10, Y8, Y0
	VFMADD231PS Y11, Y8, Y1
	VFMADD231PS Y12, Y8, Y2
	VFMADD231PS Y13, Y8, Y3
	VFMADD231PS Y10, Y9, Y4
	VFMADD231PS Y11, Y9, Y5
	VFMADD231PS Y12, Y9, Y6
	VFMADD231PS Y13, Y9, Y7
	ADDQ $4, DX
	ADDQ $4, R14
	ADDQ R8, BX
	DECQ CX
	JNE m2key
m2store:
	VMOVUPS Y0, 0(DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	VMOVUPS Y3, 96(DI)
	VMOVUPS Y4, 0(R12)
	VMOVUPS Y5, 32(R12)
	VMOVUPS Y6, 64(R12)
	VMOVUPS Y7, 96(R12)
	ADDQ $128, DI
	ADDQ $128, R12
	ADDQ $128, SI
	DECQ R10
	JNE m2chunk
	VZEROUPPER
	RET

DATA expc<>+0(SB)/4, $1.44269504088896341   // log2(e)
DATA expc<>+4(SB)/4, $0.5
DATA expc<>+8(SB)/4, $0.693359375           // ln2 high part
DATA expc<>+12(SB)/4, $-2.12194440e-4       // ln2 low part
DATA expc<>+16(SB)/4, $0.0013888889         // 1/720
DATA expc<>+20(SB)/4, $0x3c088889           // 1/120 (float32(1.0/120) exactly, as Exp uses it)
DATA expc<>+24(SB)/4, $0.041666667          // 1/24
DATA expc<>+28(SB)/4, $0.16666667           // 1/6
DATA expc<>+32(SB)/4, $1.0
DATA expc<>+36(SB)/4, $-87.3
GLOBL expc<>(SB), RODATA|NOPTR, $40

// func expSubAVX2(s *float32, n int, mx float32) float32
// s[j] = e^(s[j]-mx) for n a multiple of 8, returning Σ s[j] (lane sums,
// then the fixed horizontal order). The polynomial is Exp's; arguments
// below -87.3 give 0, and the softmax never passes positive ones.
TEXT ·expSubAVX2(SB), NOSPLIT, $0-28
	MOVQ s+0(FP), SI
	MOVQ n+8(FP), CX
	SHRQ $3, CX
	VBROADCASTSS mx+16(FP), Y15
	VBROADCASTSS expc<>+0(SB), Y14
	VBROADCASTSS expc<>+4(SB), Y13
	VBROADCASTSS expc<>+8(SB), Y12
	VBROADCASTSS expc<>+12(SB), Y11
	VBROADCASTSS expc<>+32(SB), Y10
	VBROADCASTSS expc<>+36(SB), Y9
	VXORPS Y0, Y0, Y0
	TESTQ CX, CX
	JEQ exdone
exloop:
	VMOVUPS (SI), Y1
	VSUBPS Y15, Y1, Y1              // x = s - mx
	VCMPPS $5, Y9, Y1, Y8          // keep lanes with x >= -87.3 (not less-than)
	VMAXPS Y9, Y1, Y1               // clamp so k stays in range
	VMULPS Y14, Y1, Y2
	VADDPS Y13, Y2, Y2
	VROUNDPS $1, Y2, Y2             // k = floor(x·log2e + 0.5)
	VMULPS Y12, Y2, Y3
	VSUBPS Y3, Y1, Y3               // r = x - k·ln2hi
	VMULPS Y11, Y2, Y4
	VSUBPS Y4, Y3, Y3               //   - k·ln2lo
	VBROADCASTSS expc<>+16(SB), Y4
	VBROADCASTSS expc<>+20(SB), Y5
	VMULPS Y3, Y4, Y4
	VADDPS Y5, Y4, Y4
	VBROADCASTSS expc<>+24(SB), Y5
	VMULPS Y3, Y4, Y4
	VADDPS Y5, Y4, Y4
	VBROADCASTSS expc<>+28(SB), Y5
	VMULPS Y3, Y4, Y4
	VADDPS Y5, Y4, Y4
	VMULPS Y3, Y4, Y4
	VADDPS Y13, Y4, Y4
	VMULPS Y3, Y4, Y4
	VADDPS Y10, Y4, Y4
	VMULPS Y3, Y4, Y4
	VADDPS Y10, Y4, Y4              // p = Horner(r)
	VCVTPS2DQ Y2, Y2
	VPSLLD $23, Y2, Y2
	VPADDD Y10, Y2, Y2              // 2^k as float bits: (k<<23) + bits(1.0)
	VMULPS Y2, Y4, Y4
	VANDPS Y8, Y4, Y4
	VMOVUPS Y4, (SI)
	VADDPS Y4, Y0, Y0
	ADDQ $32, SI
	DECQ CX
	JNE exloop
exdone:
	HSUM_Y0
	VZEROUPPER
	MOVSS X0, ret+24(FP)
	RET

DATA q8c<>+0(SB)/4, $0x7fffffff
DATA q8c<>+4(SB)/4, $127.0
DATA q8c<>+8(SB)/4, $1.0
GLOBL q8c<>(SB), RODATA|NOPTR, $12
DATA q8perm<>+0(SB)/4, $0
DATA q8perm<>+4(SB)/4, $4
DATA q8perm<>+8(SB)/4, $1
DATA q8perm<>+12(SB)/4, $5
DATA q8perm<>+16(SB)/4, $2
DATA q8perm<>+20(SB)/4, $6
DATA q8perm<>+24(SB)/4, $3
DATA q8perm<>+28(SB)/4, $7
GLOBL q8perm<>(SB), RODATA|NOPTR, $32

// func quantizeRow8AVX2(x8 *int8, xs, x *float32, ng int)
// QuantizeRow8 for ng groups of 64: s = max|x|/127, inv = 1/s (0 when s is
// 0), x8 = round-to-even(x·inv), the arithmetic of the Go version, so the
// results are identical. VPACKSSDW/VPACKSSWB interleave 128-bit lanes; one
// VPERMD puts the bytes back in order.
TEXT ·quantizeRow8AVX2(SB), NOSPLIT, $0-32
	MOVQ x8+0(FP), DI
	MOVQ xs+8(FP), R8
	MOVQ x+16(FP), SI
	MOVQ ng+24(FP), CX
	VBROADCASTSS q8c<>+0(SB), Y15
	VMOVDQU q8perm<>(SB), Y14
	TESTQ CX, CX
	JEQ qrdone
qrloop:
	VANDPS 0(SI), Y15, Y0
	VANDPS 32(SI), Y15, Y1
	VANDPS 64(SI), Y15, Y2
	VANDPS 96(SI), Y15, Y3
	VMAXPS Y1, Y0, Y0
	VMAXPS Y3, Y2, Y2
	VANDPS 128(SI), Y15, Y4
	VANDPS 160(SI), Y15, Y5
	VANDPS 192(SI), Y15, Y6
	VANDPS 224(SI), Y15, Y7
	VMAXPS Y5, Y4, Y4
	VMAXPS Y7, Y6, Y6
	VMAXPS Y2, Y0, Y0
	VMAXPS Y6, Y4, Y4
	VMAXPS Y4, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VMAXPS X1, X0, X0
	VPERMILPS $0x4e, X0, X1
	VMAXPS X1, X0, X0
	VPERMILPS $0xb1, X0, X1
	VMAXPS X1, X0, X0              // m = max|x| in every lane
	VDIVSS q8c<>+4(SB), X0, X0     // s = m/127
	VMOVSS X0, (R8)
	VXORPS X1, X1, X1
	VUCOMISS X1, X0
	JEQ qrzero
	VMOVSS q8c<>+8(SB), X2
	VDIVSS X0, X2, X2              // inv = 1/s
	VBROADCASTSS X2, Y13
	JMP qrconv
qrzero:
	VXORPS Y13, Y13, Y13
qrconv:
	VMULPS 0(SI), Y13, Y0
	VMULPS 32(SI), Y13, Y1
	VMULPS 64(SI), Y13, Y2
	VMULPS 96(SI), Y13, Y3
	VMULPS 128(SI), Y13, Y4
	VMULPS 160(SI), Y13, Y5
	VMULPS 192(SI), Y13, Y6
	VMULPS 224(SI), Y13, Y7
	VCVTPS2DQ Y0, Y0
	VCVTPS2DQ Y1, Y1
	VCVTPS2DQ Y2, Y2
	VCVTPS2DQ Y3, Y3
	VCVTPS2DQ Y4, Y4
	VCVTPS2DQ Y5, Y5
	VCVTPS2DQ Y6, Y6
	VCVTPS2DQ Y7, Y7
	VPACKSSDW Y1, Y0, Y0
	VPACKSSDW Y3, Y2, Y2
	VPACKSSDW Y5, Y4, Y4
	VPACKSSDW Y7, Y6, Y6
	VPACKSSWB Y2, Y0, Y0
	VPACKSSWB Y6, Y4, Y4
	VPERMD Y0, Y14, Y0
	VPERMD Y4, Y14, Y4
	VMOVDQU Y0, 0(DI)
	VMOVDQU Y4, 32(DI)
	ADDQ $256, SI
	ADDQ $64, DI
	ADDQ $4, R8
	DECQ CX
	JNE qrloop
qrdone:
	VZEROUPPER
	RET
