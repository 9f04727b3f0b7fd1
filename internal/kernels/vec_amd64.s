//go:build amd64

#include "textflag.h"

// func mulAddAVX2(s, w, x *float32, n int)
// s += w·x with VMULPS then VADDPS (the product rounded first, as Go
// computes s += w*x); n a multiple of 8.
TEXT ·mulAddAVX2(SB), NOSPLIT, $0-32
	MOVQ s+0(FP), DI
	MOVQ w+8(FP), SI
	MOVQ x+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $3, CX
	JEQ done
loop:
	VMOVUPS (SI), Y0
	VMULPS (DX), Y0, Y0
	VADDPS (DI), Y0, Y0
	VMOVUPS Y0, (DI)
	ADDQ $32, SI
	ADDQ $32, DX
	ADDQ $32, DI
	DECQ CX
	JNE loop
	VZEROUPPER
done:
	RET

// func maxAVX2(s *float32, n int) float32
// The largest of n floats, n a positive multiple of 8 (max is exact, so the
// lane order does not matter).
TEXT ·maxAVX2(SB), NOSPLIT, $0-20
	MOVQ s+0(FP), SI
	MOVQ n+8(FP), CX
	SHRQ $3, CX
	VMOVUPS (SI), Y0
	ADDQ $32, SI
	DECQ CX
	JEQ mreduce
mloop:
	VMAXPS (SI), Y0, Y0
	ADDQ $32, SI
	DECQ CX
	JNE mloop
mreduce:
	VEXTRACTF128 $1, Y0, X1
	VMAXPS X1, X0, X0
	VPERMILPS $0x4e, X0, X1
	VMAXPS X1, X0, X0
	VPERMILPS $0xb1, X0, X1
	VMAXPS X1, X0, X0
	VZEROUPPER
	MOVSS X0, ret+16(FP)
	RET

// func scaleAVX2(x *float32, a float32, n int)
// x *= a for n a multiple of 8.
TEXT ·scaleAVX2(SB), NOSPLIT, $0-24
	MOVQ x+0(FP), DI
	VBROADCASTSS a+8(FP), Y1
	MOVQ n+16(FP), CX
	SHRQ $3, CX
	JEQ sdone
sloop:
	VMULPS (DI), Y1, Y0
	VMOVUPS Y0, (DI)
	ADDQ $32, DI
	DECQ CX
	JNE sloop
	VZEROUPPER
sdone:
	RET

// Sum of the two accumulators A and B of one row, then the horizontal sum
// of dotF32AVX2 (same operations, same order), stored at dst.
#define F32ROWSUM(A, B, XA, dst) \
	VADDPS B, A, A \
	VEXTRACTF128 $1, A, X1 \
	VADDPS X1, XA, XA \
	VHADDPS XA, XA, XA \
	VHADDPS XA, XA, XA \
	MOVSS XA, dst

// func dotF32x4AVX2(w, x *float32, xstride, n int, out *float32, ostride int)
// dotF32AVX2 of one weight row against four activation rows (xstride bytes
// apart), writing out[k·ostride bytes]; each row's operations are
// dotF32AVX2's, so each result is bit-identical to it. The weight row is
// loaded once for the four rows: the router of a prefill chunk is this
// shape (f32 weights, hundreds of rows).
TEXT ·dotF32x4AVX2(SB), NOSPLIT, $0-48
	MOVQ w+0(FP), SI
	MOVQ x+8(FP), DI
	MOVQ xstride+16(FP), BX
	LEAQ (BX)(BX*2), DX
	MOVQ n+24(FP), CX
	SHRQ $4, CX
	VXORPS Y0, Y0, Y0
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	TESTQ CX, CX
	JEQ f4done
f4loop:
	VMOVUPS 0(SI), Y1
	VMOVUPS 32(SI), Y2
	VFMADD231PS 0(DI), Y1, Y0
	VFMADD231PS 32(DI), Y2, Y4
	VFMADD231PS 0(DI)(BX*1), Y1, Y5
	VFMADD231PS 32(DI)(BX*1), Y2, Y6
	VFMADD231PS 0(DI)(BX*2), Y1, Y7
	VFMADD231PS 32(DI)(BX*2), Y2, Y8
	VFMADD231PS 0(DI)(DX*1), Y1, Y9
	VFMADD231PS 32(DI)(DX*1), Y2, Y10
	ADDQ $64, SI
	ADDQ $64, DI
	DECQ CX
	JNE f4loop
f4done:
	MOVQ out+32(FP), AX
	MOVQ ostride+40(FP), BX
	F32ROWSUM(Y0, Y4, X0, 0(AX))
	ADDQ BX, AX
	F32ROWSUM(Y5, Y6, X5, 0(AX))
	ADDQ BX, AX
	F32ROWSUM(Y7, Y8, X7, 0(AX))
	ADDQ BX, AX
	F32ROWSUM(Y9, Y10, X9, 0(AX))
	VZEROUPPER
	RET

// func mulSetAVX2(s, w, x *float32, n int)
// s = 0 + w·x (VMULPS, then VADDPS to +0); n a multiple of 8.
TEXT ·mulSetAVX2(SB), NOSPLIT, $0-32
	MOVQ s+0(FP), DI
	MOVQ w+8(FP), SI
	MOVQ x+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $3, CX
	JEQ msdone
	VXORPS Y2, Y2, Y2
msloop:
	VMOVUPS (SI), Y0
	VMULPS (DX), Y0, Y0
	VADDPS Y2, Y0, Y0
	VMOVUPS Y0, (DI)
	ADDQ $32, SI
	ADDQ $32, DX
	ADDQ $32, DI
	DECQ CX
	JNE msloop
	VZEROUPPER
msdone:
	RET

// func addAVX2(y, x *float32, n int)
// y += x; n a multiple of 8.
TEXT ·addAVX2(SB), NOSPLIT, $0-24
	MOVQ y+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $3, CX
	JEQ adone
aloop:
	VMOVUPS (DI), Y0
	VADDPS (SI), Y0, Y0
	VMOVUPS Y0, (DI)
	ADDQ $32, SI
	ADDQ $32, DI
	DECQ CX
	JNE aloop
	VZEROUPPER
adone:
	RET

// func deltaRule32AVX2(S, k, q, v, kv, o *float32, decay, beta float32, dk, dv int)
// deltaRuleAVX2 (dot_amd64.s) for dv a multiple of 32, one block of 32
// columns at a time: the block's kv and o stay in registers across the dk
// rows instead of being loaded and stored for every row. Each element sees
// the same operations in the same order, so the results are identical.
TEXT ·deltaRule32AVX2(SB), NOSPLIT, $0-88
	MOVQ pf+72(FP), R14
	MOVQ pfstep+80(FP), AX
	MOVQ S+0(FP), SI
	MOVQ k+8(FP), R8
	MOVQ q+16(FP), R9
	MOVQ v+24(FP), R10
	MOVQ kv+32(FP), R11
	MOVQ o+40(FP), R12
	VBROADCASTSS decay+48(FP), Y14
	VBROADCASTSS beta+52(FP), Y15
	MOVQ dv+64(FP), DX
	SHLQ $2, DX                // row stride in bytes
	MOVQ DX, BX
	SHRQ $7, BX                // 32-column blocks
d32block:
	// pass 1: S *= decay; kv += S[a]·k[a]
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	MOVQ SI, DI
	MOVQ R8, R13
	MOVQ dk+56(FP), CX
d32p1:
	PREFETCHT0 (R14)
	ADDQ AX, R14
	VBROADCASTSS (R13), Y8
	VMULPS 0(DI), Y14, Y9
	VMOVUPS Y9, 0(DI)
	VFMADD231PS Y9, Y8, Y0
	VMULPS 32(DI), Y14, Y9
	VMOVUPS Y9, 32(DI)
	VFMADD231PS Y9, Y8, Y1
	VMULPS 64(DI), Y14, Y9
	VMOVUPS Y9, 64(DI)
	VFMADD231PS Y9, Y8, Y2
	VMULPS 96(DI), Y14, Y9
	VMOVUPS Y9, 96(DI)
	VFMADD231PS Y9, Y8, Y3
	ADDQ DX, DI
	ADDQ $4, R13
	DECQ CX
	JNE d32p1
	// kv = beta·(v − kv)
	VMOVUPS 0(R10), Y9
	VSUBPS Y0, Y9, Y0
	VMULPS Y15, Y0, Y0
	VMOVUPS 32(R10), Y9
	VSUBPS Y1, Y9, Y1
	VMULPS Y15, Y1, Y1
	VMOVUPS 64(R10), Y9
	VSUBPS Y2, Y9, Y2
	VMULPS Y15, Y2, Y2
	VMOVUPS 96(R10), Y9
	VSUBPS Y3, Y9, Y3
	VMULPS Y15, Y3, Y3
	VMOVUPS Y0, 0(R11)
	VMOVUPS Y1, 32(R11)
	VMOVUPS Y2, 64(R11)
	VMOVUPS Y3, 96(R11)
	// pass 2: S[a] += k[a]·kv; o += S[a]·q[a]
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	MOVQ SI, DI
	MOVQ R8, R13
	MOVQ R9, R15
	MOVQ dk+56(FP), CX
d32p2:
	PREFETCHT0 (R14)
	ADDQ AX, R14
	VBROADCASTSS (R13), Y8
	VBROADCASTSS (R15), Y10
	VMOVUPS 0(DI), Y9
	VFMADD231PS Y0, Y8, Y9
	VMOVUPS Y9, 0(DI)
	VFMADD231PS Y9, Y10, Y4
	VMOVUPS 32(DI), Y9
	VFMADD231PS Y1, Y8, Y9
	VMOVUPS Y9, 32(DI)
	VFMADD231PS Y9, Y10, Y5
	VMOVUPS 64(DI), Y9
	VFMADD231PS Y2, Y8, Y9
	VMOVUPS Y9, 64(DI)
	VFMADD231PS Y9, Y10, Y6
	VMOVUPS 96(DI), Y9
	VFMADD231PS Y3, Y8, Y9
	VMOVUPS Y9, 96(DI)
	VFMADD231PS Y9, Y10, Y7
	ADDQ DX, DI
	ADDQ $4, R13
	ADDQ $4, R15
	DECQ CX
	JNE d32p2
	VMOVUPS Y4, 0(R12)
	VMOVUPS Y5, 32(R12)
	VMOVUPS Y6, 64(R12)
	VMOVUPS Y7, 96(R12)
	// next block of columns
	ADDQ $128, SI
	ADDQ $128, R10
	ADDQ $128, R11
	ADDQ $128, R12
	DECQ BX
	JNE d32block
	VZEROUPPER
	RET

// READSUM adds the readers' four accumulators Y0-Y3 (uint64 lanes) into AX.
#define READSUM \
	VPADDQ Y1, Y0, Y0 \
	VPADDQ Y3, Y2, Y2 \
	VPADDQ Y2, Y0, Y0 \
	VEXTRACTI128 $1, Y0, X1 \
	VPADDQ X1, X0, X0 \
	VPSHUFD $0x4e, X0, X1 \
	VPADDQ X1, X0, X0 \
	VMOVQ X0, AX

// func readAVX2(p *byte, n int) uint64
// Sums n blocks of 256 bytes as uint64 lanes: four independent chains, so
// that only the loads limit it.
TEXT ·readAVX2(SB), NOSPLIT, $0-24
	MOVQ p+0(FP), SI
	MOVQ n+8(FP), CX
	VPXOR Y0, Y0, Y0
	VPXOR Y1, Y1, Y1
	VPXOR Y2, Y2, Y2
	VPXOR Y3, Y3, Y3
rdloop:
	VPADDQ 0(SI), Y0, Y0
	VPADDQ 32(SI), Y1, Y1
	VPADDQ 64(SI), Y2, Y2
	VPADDQ 96(SI), Y3, Y3
	VPADDQ 128(SI), Y0, Y0
	VPADDQ 160(SI), Y1, Y1
	VPADDQ 192(SI), Y2, Y2
	VPADDQ 224(SI), Y3, Y3
	ADDQ $256, SI
	DECQ CX
	JNE rdloop
	READSUM
	MOVQ AX, ret+16(FP)
	VZEROUPPER
	RET

// func readAVX2x4(p, q, r, s *byte, n int) uint64
// readAVX2 over four regions at once (n blocks of 256 bytes each), a 64
// bytes of each in turn: four streams of loads, which this machine class
// reads about a fifth faster than one (BenchmarkMemBWStreams).
TEXT ·readAVX2x4(SB), NOSPLIT, $0-48
	MOVQ p+0(FP), SI
	MOVQ q+8(FP), DI
	MOVQ r+16(FP), R8
	MOVQ s+24(FP), R9
	MOVQ n+32(FP), CX
	VPXOR Y0, Y0, Y0
	VPXOR Y1, Y1, Y1
	VPXOR Y2, Y2, Y2
	VPXOR Y3, Y3, Y3
	TESTQ CX, CX
	JEQ r4done
r4loop:
	VPADDQ 0(SI), Y0, Y0
	VPADDQ 32(SI), Y1, Y1
	VPADDQ 0(DI), Y2, Y2
	VPADDQ 32(DI), Y3, Y3
	VPADDQ 0(R8), Y0, Y0
	VPADDQ 32(R8), Y1, Y1
	VPADDQ 0(R9), Y2, Y2
	VPADDQ 32(R9), Y3, Y3
	VPADDQ 64(SI), Y0, Y0
	VPADDQ 96(SI), Y1, Y1
	VPADDQ 64(DI), Y2, Y2
	VPADDQ 96(DI), Y3, Y3
	VPADDQ 64(R8), Y0, Y0
	VPADDQ 96(R8), Y1, Y1
	VPADDQ 64(R9), Y2, Y2
	VPADDQ 96(R9), Y3, Y3
	VPADDQ 128(SI), Y0, Y0
	VPADDQ 160(SI), Y1, Y1
	VPADDQ 128(DI), Y2, Y2
	VPADDQ 160(DI), Y3, Y3
	VPADDQ 128(R8), Y0, Y0
	VPADDQ 160(R8), Y1, Y1
	VPADDQ 128(R9), Y2, Y2
	VPADDQ 160(R9), Y3, Y3
	VPADDQ 192(SI), Y0, Y0
	VPADDQ 224(SI), Y1, Y1
	VPADDQ 192(DI), Y2, Y2
	VPADDQ 224(DI), Y3, Y3
	VPADDQ 192(R8), Y0, Y0
	VPADDQ 224(R8), Y1, Y1
	VPADDQ 192(R9), Y2, Y2
	VPADDQ 224(R9), Y3, Y3
	ADDQ $256, SI
	ADDQ $256, DI
	ADDQ $256, R8
	ADDQ $256, R9
	DECQ CX
	JNE r4loop
r4done:
	READSUM
	MOVQ AX, ret+40(FP)
	VZEROUPPER
	RET
