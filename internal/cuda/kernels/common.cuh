// Shared device helpers of sluice's kernels.
//
// Numerics: the kernels are compiled with -fmad=false, so a product and a
// following sum are rounded separately, as the CPU kernels of
// internal/kernels compute them; a fused multiply-add is written out as
// fmaf where the CPU's assembly uses one (VFMADD) or where no CPU twin
// fixes the order. Where a comment says "as the CPU", the arithmetic is the
// CPU kernel's, operation for operation, so the results are bit-identical.
#pragma once
#include <stdint.h>
#include <cuda_fp16.h>

#define FULL_MASK 0xffffffffu

// PDL_ENTRY opens every kernel. Built with SLUICE_PDL (the sm_90 PTX,
// scripts/gpu-ptx.sh), the host launches kernels with programmatic
// dependent launch (Hopper and later): a kernel's blocks may start while
// the kernel before it on the stream still runs, so that its launch and
// ramp-up overlap the predecessor's tail instead of following it. Each
// kernel therefore first waits until its predecessor has finished and its
// writes are visible (griddepcontrol.wait, which returns at once for a
// launch without the attribute), and only then lets its own successor
// start (launch_dependents): a grid waits on its predecessor, which
// waited on its own, so every kernel still sees all the work queued
// before it, and no kernel's blocks can hold a multiprocessor that a
// predecessor's unstarted blocks need. Without SLUICE_PDL (the sm_80
// PTX) it is empty.
#ifdef SLUICE_PDL
#define PDL_ENTRY                                          \
    asm volatile("griddepcontrol.wait;" ::: "memory");     \
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#else
#define PDL_ENTRY
#endif

// ld_half loads a quantisation scale or bias of the packed format (an IEEE
// half, format 3) as float32, exactly: as the CPU widens it.
__device__ __forceinline__ float ld_half(const uint16_t* p) { return __half2float(__ushort_as_half(__ldg(p))); }

// sl_exp is kernels.Exp: e^x in float32 by range reduction to 2^k·e^r and
// a degree-6 polynomial, every step rounded as the CPU rounds it.
__device__ __forceinline__ float sl_exp(float x) {
    if (x < -87.3f) return 0.0f;
    if (x > 88.7f) return __int_as_float(0x7f800000);
    float k = floorf(__fadd_rn(__fmul_rn(x, 1.44269504088896341f), 0.5f));
    float r = __fsub_rn(__fsub_rn(x, __fmul_rn(k, 0.693359375f)), __fmul_rn(k, -2.12194440e-4f));
    float p = 1.0f / 720.0f;
    p = __fadd_rn(__fmul_rn(p, r), 1.0f / 120.0f);
    p = __fadd_rn(__fmul_rn(p, r), 1.0f / 24.0f);
    p = __fadd_rn(__fmul_rn(p, r), 1.0f / 6.0f);
    p = __fadd_rn(__fmul_rn(p, r), 0.5f);
    p = __fadd_rn(__fmul_rn(p, r), 1.0f);
    p = __fadd_rn(__fmul_rn(p, r), 1.0f);
    return __fmul_rn(p, __int_as_float(((int)k + 127) << 23));
}

// att_skip reports whether an attention launch gated by gate skips a
// recorded step of rows rows whose first row is at pos: its work is rows ·
// the chunks of chunk positions its last row reads (at most topk of them
// when topk > 0), and a launch with gate > 0 runs from gate units of work,
// one with gate < 0 below -gate, one with gate 0 always. Two launches gated
// by g and -g share a step's depths between them, each block deciding alike
// from the position read on the device.
__device__ __forceinline__ bool att_skip(int gate, int pos, int rows, int topk, int chunk) {
    if (gate == 0) return false;
    int n = pos + rows;
    if (topk > 0) n = min(n, topk);
    int units = rows * ((n + chunk - 1) / chunk);
    return gate > 0 ? units < gate : units >= -gate;
}

// sl_sigmoid is kernels.Sigmoid: 1/(1+e^-x).
__device__ __forceinline__ float sl_sigmoid(float x) {
    return __fdiv_rn(1.0f, __fadd_rn(1.0f, sl_exp(-x)));
}

// sl_silu is kernels.SiLU: x·sigmoid(x).
__device__ __forceinline__ float sl_silu(float x) { return __fmul_rn(x, sl_sigmoid(x)); }

// warp_sum32 is the sum over a warp's lanes as a fixed butterfly: every
// lane ends with the same bits (each step adds two equal pairs), and the
// order never depends on anything but the lane.
__device__ __forceinline__ float warp_sum32(float v) {
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) v = __fadd_rn(v, __shfl_xor_sync(FULL_MASK, v, m));
    return v;
}

// hsum8_lanes is kernels.hsum8 over lanes 0..7 of a warp:
// ((s0+s4)+(s1+s5)) + ((s2+s6)+(s3+s7)). Every lane returns the total.
__device__ __forceinline__ float hsum8_lanes(float s) {
    float v[8];
#pragma unroll
    for (int l = 0; l < 8; l++) v[l] = __shfl_sync(FULL_MASK, s, l);
    return __fadd_rn(__fadd_rn(__fadd_rn(v[0], v[4]), __fadd_rn(v[1], v[5])),
                     __fadd_rn(__fadd_rn(v[2], v[6]), __fadd_rn(v[3], v[7])));
}

// lanes32_sum is kernels.sumSquares's final step for per-lane partial sums
// a (lane l holding the CPU's a[l]): s[l] = (a[l]+a[8+l]) + (a[16+l]+a[24+l])
// for l < 8, then hsum8. Every lane returns the total.
__device__ __forceinline__ float lanes32_sum(float a) {
    int lane = threadIdx.x & 31;
    float a8 = __shfl_sync(FULL_MASK, a, (lane + 8) & 31);
    float a16 = __shfl_sync(FULL_MASK, a, (lane + 16) & 31);
    float a24 = __shfl_sync(FULL_MASK, a, (lane + 24) & 31);
    float s = __fadd_rn(__fadd_rn(a, a8), __fadd_rn(a16, a24));
    return hsum8_lanes(s);
}

// mma_s8 is D += A·B for one m16n8k32 int8 tensor-core tile (sm_80+):
// lane → gid = lane/4, t = lane%4; A row-major 16x32: a0 = A[gid][4t..],
// a1 = A[gid+8][4t..], a2 = A[gid][16+4t..], a3 = A[gid+8][16+4t..]; B 32x8
// by column: b0 = B[4t..][gid], b1 = B[16+4t..][gid]; D: d0 = D[gid][2t],
// d1 = D[gid][2t+1], d2 = D[gid+8][2t], d3 = D[gid+8][2t+1]. Integer sums
// are exact, so the result does not depend on how the hardware orders
// them.
__device__ __forceinline__ void mma_s8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// cp_async16, cp_async8, cp_async4 copy 16, 8 or 4 bytes from global to
// shared memory without a register (sm_80+), in the group that the next
// cp_async_commit closes; cp_async_wait<N> waits until at most N groups
// are in flight.
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src));
}

__device__ __forceinline__ void cp_async8(void* dst, const void* src) {
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(d), "l"(src));
}

__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d), "l"(src));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }
