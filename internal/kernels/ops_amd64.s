//go:build amd64

#include "textflag.h"

// Element-wise kernels of ops.go. Every one computes, lane by lane, exactly
// the arithmetic of its pure-Go twin: separate VMULPS/VADDPS (never FMA,
// which the Go compiler does not emit on amd64), IEEE VDIVPS/VSQRTSD (never
// the approximate VRCPPS/VRSQRTPS), and sums accumulated in the lane
// structure the twin spells out. Tails shorter than 8 are done with
// VMASKMOVPS: masked-off lanes load 0 and are never stored.

// Constants of Exp (attend.go) as the float32 bit patterns Go gives its
// untyped constants, so the assembler's decimal parsing cannot round them
// differently.
DATA opsc<>+0(SB)/4, $0x3fb8aa3b  // log2(e)
DATA opsc<>+4(SB)/4, $0x3f000000  // 0.5
DATA opsc<>+8(SB)/4, $0x3f318000  // ln2 high part 0.693359375
DATA opsc<>+12(SB)/4, $0xb95e8083 // ln2 low part -2.12194440e-4
DATA opsc<>+16(SB)/4, $0x3ab60b61 // 1/720
DATA opsc<>+20(SB)/4, $0x3c088889 // 1/120
DATA opsc<>+24(SB)/4, $0x3d2aaaab // 1/24
DATA opsc<>+28(SB)/4, $0x3e2aaaab // 1/6
DATA opsc<>+32(SB)/4, $0x3f800000 // 1.0
DATA opsc<>+36(SB)/4, $0xc2ae999a // -87.3: below, Exp is 0
DATA opsc<>+40(SB)/4, $0x42b16666 // 88.7: above, Exp is +Inf
DATA opsc<>+44(SB)/4, $0x80000000 // sign bit
DATA opsc<>+48(SB)/4, $0xff800000 // -Inf
DATA opsc<>+56(SB)/8, $1.0        // float64 1, for the norms' 1/sqrt
GLOBL opsc<>(SB), RODATA|NOPTR, $64

// tailmask<>+32-4r is a mask of r leading lanes (r in 1..7).
DATA tailmask<>+0(SB)/8, $-1
DATA tailmask<>+8(SB)/8, $-1
DATA tailmask<>+16(SB)/8, $-1
DATA tailmask<>+24(SB)/8, $-1
DATA tailmask<>+32(SB)/8, $0
DATA tailmask<>+40(SB)/8, $0
DATA tailmask<>+48(SB)/8, $0
DATA tailmask<>+56(SB)/8, $0
GLOBL tailmask<>(SB), RODATA|NOPTR, $64

// TAILMASK sets M to the mask of the first r lanes; r (1..7) is clobbered,
// as is AX.
#define TAILMASK(r, M) \
	LEAQ tailmask<>+32(SB), AX \
	SHLQ $2, r \
	SUBQ r, AX \
	VMOVDQU (AX), M

// EXPCONST loads Exp's constants that stay in registers: Y15 log2(e),
// Y14 0.5, Y13 ln2hi, Y12 ln2lo, Y11 1.0, Y10 -87.3, Y9 88.7.
#define EXPCONST \
	VBROADCASTSS opsc<>+0(SB), Y15 \
	VBROADCASTSS opsc<>+4(SB), Y14 \
	VBROADCASTSS opsc<>+8(SB), Y13 \
	VBROADCASTSS opsc<>+12(SB), Y12 \
	VBROADCASTSS opsc<>+32(SB), Y11 \
	VBROADCASTSS opsc<>+36(SB), Y10 \
	VBROADCASTSS opsc<>+40(SB), Y9

// EXP sets P = Exp(X) per lane, step for step as the scalar Exp: lanes
// below -87.3 give 0 (M masks them off; NLT is true for NaN, so NaN is
// kept), the argument is clamped to [-87.3, 88.7] so k fits the exponent
// field (88.7 gives k = 128, whose 2^k is +Inf, Exp's answer above 88.7),
// k = floor(x·log2e + 0.5), r = x - k·ln2hi - k·ln2lo, Horner's degree-6
// polynomial, times 2^k built as (k<<23) + bits(1.0). X is the second
// source of VMAXPS/VMINPS so that a NaN passes through as the scalar's
// does. X is clobbered (it ends as r); K, M, T are scratch.
#define EXP(X, K, M, P, T) \
	VCMPPS $5, Y10, X, M \
	VMAXPS X, Y10, X \
	VMINPS X, Y9, X \
	VMULPS Y15, X, K \
	VADDPS Y14, K, K \
	VROUNDPS $1, K, K \
	VMULPS Y13, K, T \
	VSUBPS T, X, X \
	VMULPS Y12, K, T \
	VSUBPS T, X, X \
	VBROADCASTSS opsc<>+16(SB), P \
	VMULPS X, P, P \
	VBROADCASTSS opsc<>+20(SB), T \
	VADDPS T, P, P \
	VMULPS X, P, P \
	VBROADCASTSS opsc<>+24(SB), T \
	VADDPS T, P, P \
	VMULPS X, P, P \
	VBROADCASTSS opsc<>+28(SB), T \
	VADDPS T, P, P \
	VMULPS X, P, P \
	VADDPS Y14, P, P \
	VMULPS X, P, P \
	VADDPS Y11, P, P \
	VMULPS X, P, P \
	VADDPS Y11, P, P \
	VCVTPS2DQ K, K \
	VPSLLD $23, K, K \
	VPADDD Y11, K, K \
	VMULPS K, P, P \
	VANDPS M, P, P

// SIGMOID sets P = 1/(1+Exp(-G)) per lane, as the scalar Sigmoid; Y8 holds
// the sign bit. G is kept.
#define SIGMOID(G, X, K, M, P, T) \
	VXORPS Y8, G, X \
	EXP(X, K, M, P, T) \
	VADDPS Y11, P, P \
	VDIVPS P, Y11, P

// HSUM adds the lanes of Y0 into X0 in a fixed order:
// ((l0+l4)+(l1+l5)) + ((l2+l6)+(l3+l7)), which hsum8 repeats in Go.
#define HSUM \
	VEXTRACTF128 $1, Y0, X1 \
	VADDPS X1, X0, X0 \
	VHADDPS X0, X0, X0 \
	VHADDPS X0, X0, X0

// SUMSQ sets X0 = Σ x[i]² for the CX floats at SI in sumSquares' lane
// structure: 32-float blocks into four accumulators Y0..Y3, the rest
// (8-float chunks, then a masked tail) into Y0, then (Y0+Y1)+(Y2+Y3) and
// HSUM. Clobbers AX, BX, DX, Y1..Y5.
#define SUMSQ \
	VXORPS Y0, Y0, Y0 \
	VXORPS Y1, Y1, Y1 \
	VXORPS Y2, Y2, Y2 \
	VXORPS Y3, Y3, Y3 \
	MOVQ SI, BX \
	MOVQ CX, DX \
	SHRQ $5, DX \
	JEQ ssrest \
ss32: \
	VMOVUPS 0(BX), Y4 \
	VMULPS Y4, Y4, Y4 \
	VADDPS Y4, Y0, Y0 \
	VMOVUPS 32(BX), Y5 \
	VMULPS Y5, Y5, Y5 \
	VADDPS Y5, Y1, Y1 \
	VMOVUPS 64(BX), Y4 \
	VMULPS Y4, Y4, Y4 \
	VADDPS Y4, Y2, Y2 \
	VMOVUPS 96(BX), Y5 \
	VMULPS Y5, Y5, Y5 \
	VADDPS Y5, Y3, Y3 \
	ADDQ $128, BX \
	DECQ DX \
	JNE ss32 \
ssrest: \
	MOVQ CX, DX \
	ANDQ $31, DX \
	CMPQ DX, $8 \
	JLT sspart \
ss8: \
	VMOVUPS (BX), Y4 \
	VMULPS Y4, Y4, Y4 \
	VADDPS Y4, Y0, Y0 \
	ADDQ $32, BX \
	SUBQ $8, DX \
	CMPQ DX, $8 \
	JGE ss8 \
sspart: \
	TESTQ DX, DX \
	JEQ ssred \
	TAILMASK(DX, Y5) \
	VMASKMOVPS (BX), Y5, Y4 \
	VMULPS Y4, Y4, Y4 \
	VADDPS Y4, Y0, Y0 \
ssred: \
	VADDPS Y1, Y0, Y0 \
	VADDPS Y3, Y2, Y2 \
	VADDPS Y2, Y0, Y0 \
	HSUM

// INVSQRT sets X0 = float32(1/sqrt(float64(X0))), the norms' scale, in
// IEEE double precision as math.Sqrt computes it.
#define INVSQRT \
	VCVTSS2SD X0, X0, X0 \
	VSQRTSD X0, X0, X0 \
	VMOVSD opsc<>+56(SB), X1 \
	VDIVSD X0, X1, X0 \
	VCVTSD2SS X0, X0, X0

// func rmsNormAVX2(dst, x, w *float32, n int, eps float32, zc bool)
// dst = x·inv·w (or x·inv·(1+w) with zc), inv = 1/sqrt(Σx²/n + eps): the
// products in rmsNormGo's order, (x·inv)·w. dst may equal x: the sum reads
// all of x before anything is written, and each chunk is loaded before it
// is stored.
TEXT ·rmsNormAVX2(SB), NOSPLIT, $0-37
	MOVQ dst+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ w+16(FP), R8
	MOVQ n+24(FP), CX
	SUMSQ
	VCVTSI2SSQ CX, X1, X1
	VDIVSS X1, X0, X0            // Σx²/n
	VADDSS eps+32(FP), X0, X0
	INVSQRT
	VBROADCASTSS X0, Y6          // inv
	VBROADCASTSS opsc<>+32(SB), Y11
	MOVQ CX, DX
	SHRQ $3, DX
	MOVBLZX zc+36(FP), BX
	TESTQ BX, BX
	JNE rnzc
	TESTQ DX, DX
	JEQ rntail
rnloop:
	VMULPS (SI), Y6, Y0
	VMULPS (R8), Y0, Y0
	VMOVUPS Y0, (DI)
	ADDQ $32, SI
	ADDQ $32, R8
	ADDQ $32, DI
	DECQ DX
	JNE rnloop
rntail:
	ANDQ $7, CX
	JEQ rndone
	TAILMASK(CX, Y7)
	VMASKMOVPS (SI), Y7, Y0
	VMASKMOVPS (R8), Y7, Y1
	VMULPS Y6, Y0, Y0
	VMULPS Y1, Y0, Y0
	VMASKMOVPS Y0, Y7, (DI)
	JMP rndone
rnzc:
	TESTQ DX, DX
	JEQ rnzctail
rnzcloop:
	VMULPS (SI), Y6, Y0
	VADDPS (R8), Y11, Y1         // 1+w
	VMULPS Y1, Y0, Y0
	VMOVUPS Y0, (DI)
	ADDQ $32, SI
	ADDQ $32, R8
	ADDQ $32, DI
	DECQ DX
	JNE rnzcloop
rnzctail:
	ANDQ $7, CX
	JEQ rndone
	TAILMASK(CX, Y7)
	VMASKMOVPS (SI), Y7, Y0
	VMASKMOVPS (R8), Y7, Y1
	VMULPS Y6, Y0, Y0
	VADDPS Y11, Y1, Y1
	VMULPS Y1, Y0, Y0
	VMASKMOVPS Y0, Y7, (DI)
rndone:
	VZEROUPPER
	RET

// func l2NormAVX2(x *float32, n int, eps float32)
// x *= 1/sqrt(Σx² + eps), the sum as in RMSNorm.
TEXT ·l2NormAVX2(SB), NOSPLIT, $0-20
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	SUMSQ
	VADDSS eps+16(FP), X0, X0
	INVSQRT
	VBROADCASTSS X0, Y6
	MOVQ CX, DX
	SHRQ $3, DX
	JEQ l2tail
l2loop:
	VMULPS (SI), Y6, Y0
	VMOVUPS Y0, (SI)
	ADDQ $32, SI
	DECQ DX
	JNE l2loop
l2tail:
	ANDQ $7, CX
	JEQ l2done
	TAILMASK(CX, Y7)
	VMASKMOVPS (SI), Y7, Y0
	VMULPS Y6, Y0, Y0
	VMASKMOVPS Y0, Y7, (SI)
l2done:
	VZEROUPPER
	RET

// func siluAVX2(x *float32, n int)
// x = x·Sigmoid(x).
TEXT ·siluAVX2(SB), NOSPLIT, $0-16
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	EXPCONST
	VBROADCASTSS opsc<>+44(SB), Y8
	MOVQ CX, DX
	SHRQ $3, DX
	JEQ sitail
siloop:
	VMOVUPS (SI), Y0
	SIGMOID(Y0, Y1, Y2, Y3, Y4, Y5)
	VMULPS Y4, Y0, Y4
	VMOVUPS Y4, (SI)
	ADDQ $32, SI
	DECQ DX
	JNE siloop
sitail:
	ANDQ $7, CX
	JEQ sidone
	TAILMASK(CX, Y7)
	VMASKMOVPS (SI), Y7, Y0
	SIGMOID(Y0, Y1, Y2, Y3, Y4, Y5)
	VMULPS Y4, Y0, Y4
	VMASKMOVPS Y4, Y7, (SI)
sidone:
	VZEROUPPER
	RET

// func swigluAVX2(dst, gate, up *float32, n int)
// dst = (gate·Sigmoid(gate))·up; dst may equal gate or up.
TEXT ·swigluAVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ gate+8(FP), SI
	MOVQ up+16(FP), R8
	MOVQ n+24(FP), CX
	EXPCONST
	VBROADCASTSS opsc<>+44(SB), Y8
	MOVQ CX, DX
	SHRQ $3, DX
	JEQ swtail
swloop:
	VMOVUPS (SI), Y0
	SIGMOID(Y0, Y1, Y2, Y3, Y4, Y5)
	VMULPS Y4, Y0, Y4
	VMULPS (R8), Y4, Y4
	VMOVUPS Y4, (DI)
	ADDQ $32, SI
	ADDQ $32, R8
	ADDQ $32, DI
	DECQ DX
	JNE swloop
swtail:
	ANDQ $7, CX
	JEQ swdone
	TAILMASK(CX, Y7)
	VMASKMOVPS (SI), Y7, Y0
	VMASKMOVPS (R8), Y7, Y6
	SIGMOID(Y0, Y1, Y2, Y3, Y4, Y5)
	VMULPS Y4, Y0, Y4
	VMULPS Y6, Y4, Y4
	VMASKMOVPS Y4, Y7, (DI)
swdone:
	VZEROUPPER
	RET

// func mulSigmoidAVX2(o, gate *float32, n int)
// o = o·Sigmoid(gate).
TEXT ·mulSigmoidAVX2(SB), NOSPLIT, $0-24
	MOVQ o+0(FP), DI
	MOVQ gate+8(FP), SI
	MOVQ n+16(FP), CX
	EXPCONST
	VBROADCASTSS opsc<>+44(SB), Y8
	MOVQ CX, DX
	SHRQ $3, DX
	JEQ mstail
msloop:
	VMOVUPS (SI), Y0
	SIGMOID(Y0, Y1, Y2, Y3, Y4, Y5)
	VMULPS (DI), Y4, Y4
	VMOVUPS Y4, (DI)
	ADDQ $32, SI
	ADDQ $32, DI
	DECQ DX
	JNE msloop
mstail:
	ANDQ $7, CX
	JEQ msdone
	TAILMASK(CX, Y7)
	VMASKMOVPS (SI), Y7, Y0
	VMASKMOVPS (DI), Y7, Y6
	SIGMOID(Y0, Y1, Y2, Y3, Y4, Y5)
	VMULPS Y6, Y4, Y4
	VMASKMOVPS Y4, Y7, (DI)
msdone:
	VZEROUPPER
	RET

// func softmaxAVX2(x *float32, n int)
// Three passes as softmaxGo: the maximum m (exact in any order), e = Exp(x-m)
// stored back and summed into the 8 lanes of Y0 (element i into lane i%8,
// in index order), then x *= 1/HSUM. n ≥ 1.
TEXT ·softmaxAVX2(SB), NOSPLIT, $0-16
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	MOVQ CX, R9
	ANDQ $7, R9                  // tail length
	JEQ smnomask
	MOVQ R9, BX
	TAILMASK(BX, Y7)
smnomask:
	VBROADCASTSS opsc<>+48(SB), Y6 // -Inf
	VMOVAPS Y6, Y0
	MOVQ SI, DI
	MOVQ CX, DX
	SHRQ $3, DX
	JEQ smmaxtail
smmax:
	VMAXPS (DI), Y0, Y0
	ADDQ $32, DI
	DECQ DX
	JNE smmax
smmaxtail:
	TESTQ R9, R9
	JEQ smmaxred
	VMASKMOVPS (DI), Y7, Y1
	VBLENDVPS Y7, Y1, Y6, Y1     // masked-off lanes -Inf
	VMAXPS Y1, Y0, Y0
smmaxred:
	VEXTRACTF128 $1, Y0, X1
	VMAXPS X1, X0, X0
	VPERMILPS $0x4e, X0, X1
	VMAXPS X1, X0, X0
	VPERMILPS $0xb1, X0, X1
	VMAXPS X1, X0, X0
	VBROADCASTSS X0, Y8          // m
	EXPCONST
	VXORPS Y0, Y0, Y0
	MOVQ SI, DI
	MOVQ CX, DX
	SHRQ $3, DX
	JEQ smexptail
smexp:
	VMOVUPS (DI), Y1
	VSUBPS Y8, Y1, Y1
	EXP(Y1, Y2, Y3, Y4, Y5)
	VMOVUPS Y4, (DI)
	VADDPS Y4, Y0, Y0
	ADDQ $32, DI
	DECQ DX
	JNE smexp
smexptail:
	TESTQ R9, R9
	JEQ smsum
	VMASKMOVPS (DI), Y7, Y1
	VSUBPS Y8, Y1, Y1
	EXP(Y1, Y2, Y3, Y4, Y5)
	VANDPS Y7, Y4, Y4
	VMASKMOVPS Y4, Y7, (DI)
	VADDPS Y4, Y0, Y0
smsum:
	HSUM
	VMOVSS opsc<>+32(SB), X1
	VDIVSS X0, X1, X0            // 1/Σe
	VBROADCASTSS X0, Y6
	MOVQ SI, DI
	MOVQ CX, DX
	SHRQ $3, DX
	JEQ smscaletail
smscale:
	VMULPS (DI), Y6, Y1
	VMOVUPS Y1, (DI)
	ADDQ $32, DI
	DECQ DX
	JNE smscale
smscaletail:
	TESTQ R9, R9
	JEQ smdone
	VMASKMOVPS (DI), Y7, Y1
	VMULPS Y6, Y1, Y1
	VMASKMOVPS Y1, Y7, (DI)
smdone:
	VZEROUPPER
	RET
