// The tiled tensor-core q4 product: the device code of matvec.cu's
// q4_gemm32 and q4_gemm64, in a header of its own so that a host harness
// can compile it against stand-ins for the device's primitives.
#pragma once
#include "common.cuh"

// The tiled tensor-core q4 product (prefill, verify, the experts of a
// prefill chunk and DeepSeek's W_k and W_v a head at a time), with
// q4_rows' bits: a block computes GM outputs x BN activation rows, its
// warps 32 x BN/2 each (two 16-row tiles by BN/16 8-row tiles of mma
// m16n8k32), walking the groups in order, two a stage, through an S-stage
// ring of shared memory that cp.async fills while the warps multiply the
// stage before. Every (output, row) pair keeps one float chain in one
// thread: per group the two mma give the exact int32 Σ q·x8, then acc =
// acc + (float(s)·(scale·xs) + bias·xsum), each operation rounded, as
// q4_rows. A thread's k indices within a 32-wide slice are permuted
// alike in the weights and the activations (logical 4t+i and 16+4t+i are
// bytes 8t+i and 8t+4+i), which the exact integer sums allow, so that its
// fragments are 8-byte loads. Needs an even group count (C a multiple of
// 128): a stage is two whole groups.
#define GEMM_M 128            // outputs a block
#define GEMM_THREADS 256      // 8 warps: 4 along the outputs by 2 along the rows
#define GEMM_WSTRIDE 96       // bytes of a weight row in a stage (64 + 32: 8-byte fragment loads without bank conflicts)
#define GEMM_XSTRIDE 160      // bytes of an activation row in a stage (128 + 32)
#define GEMM_STAGES 3

// gemm_stage_bytes is one stage of the ring for BN activation rows: the
// weights, the activations, the scales and biases (one 32-bit word of two
// halves each per output) and xs, xsum (two floats each per row).
__host__ __device__ constexpr int gemm_stage_bytes(int BN) {
    return GEMM_M * GEMM_WSTRIDE + BN * GEMM_XSTRIDE + GEMM_M * 8 + BN * 16;
}

// gemm_half is the half at index h (0 or 1) of a word of two, as float.
__device__ __forceinline__ float gemm_half(uint32_t w, int h) {
    return __half2float(__ushort_as_half((unsigned short)(h ? w >> 16 : w & 0xffffu)));
}

// q4_tile computes one block's tile: outputs m0.. of the matrix W (row
// stride C/2 bytes; scales and biases [O][C/64]) for the activation rows
// rb + j·step, j < n (n <= BN), out row = activation row.
template <int BN>
__device__ __forceinline__ void q4_tile(const uint8_t* __restrict__ W, const uint16_t* __restrict__ scales,
                                        const uint16_t* __restrict__ biases, const int8_t* __restrict__ x8,
                                        const float* __restrict__ xs, const float* __restrict__ xsum,
                                        float* __restrict__ out, int O, int C, int m0, int rb, int n, int step) {
    constexpr int NT = BN / 16;                // 8-row mma tiles a warp
    constexpr int SB = gemm_stage_bytes(BN);   // bytes a stage
    constexpr int OFF_X = GEMM_M * GEMM_WSTRIDE;
    constexpr int OFF_S = OFF_X + BN * GEMM_XSTRIDE;
    constexpr int OFF_B = OFF_S + GEMM_M * 4;
    constexpr int OFF_XS = OFF_B + GEMM_M * 4;
    constexpr int OFF_XM = OFF_XS + BN * 8;
    extern __shared__ __align__(16) uint8_t gemm_smem[];
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int gid = lane >> 2, t = lane & 3;
    int wm = (warp & 3) * 32, wn = (warp >> 2) * (BN / 2); // the warp's first output and row in the tile
    int ng = C >> 6, nk = ng >> 1;
    size_t rowBytes = (size_t)(C >> 1);

    // What each thread copies a stage (source rows clamped into range:
    // their products are never stored).
    auto load = [&](int buf, int k) {
        uint8_t* st = gemm_smem + buf * SB;
        int g = 2 * k;
#pragma unroll
        for (int i = 0; i < 2; i++) { // weights: 128 rows x 4 chunks of 16 bytes
            int c = tid + i * GEMM_THREADS;
            int row = c >> 2, part = c & 3;
            int o = min(m0 + row, O - 1);
            cp_async16(st + row * GEMM_WSTRIDE + part * 16, W + (size_t)o * rowBytes + g * 32 + part * 16);
        }
#pragma unroll
        for (int i = 0; i < BN * 8 / GEMM_THREADS; i++) { // activations: BN rows x 8 chunks
            int c = tid + i * GEMM_THREADS;
            int j = c >> 3, part = c & 7;
            int r = rb + min(j, n - 1) * step;
            cp_async16(st + OFF_X + j * GEMM_XSTRIDE + part * 16, x8 + (size_t)r * C + g * 64 + part * 16);
        }
        if (tid < 2 * GEMM_M) { // scales, then biases: groups g and g+1 of a row are one aligned word
            int row = tid & (GEMM_M - 1);
            int o = min(m0 + row, O - 1);
            const uint16_t* src = (tid < GEMM_M ? scales : biases) + (size_t)o * ng + g;
            cp_async4(st + (tid < GEMM_M ? OFF_S : OFF_B) + row * 4, src);
        }
        if (tid < 2 * BN) { // xs, then xsum: two floats a row
            int j = tid % BN;
            size_t r = (size_t)(rb + min(j, n - 1) * step);
            const float* src = (tid < BN ? xs : xsum) + r * ng + g;
            cp_async8(st + (tid < BN ? OFF_XS : OFF_XM) + j * 8, src);
        }
    };

    float acc[2][NT][4];
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
        for (int b = 0; b < NT; b++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[a][b][c] = 0.0f;

#pragma unroll
    for (int s = 0; s < GEMM_STAGES - 1; s++) {
        if (s < nk) load(s, s);
        cp_async_commit();
    }
    const uint32_t M = 0x0f0f0f0fu;
    for (int k = 0; k < nk; k++) {
        cp_async_wait<GEMM_STAGES - 2>();
        __syncthreads(); // stage k landed for every thread; stage k-1's buffer is free
        if (k + GEMM_STAGES - 1 < nk) load((k + GEMM_STAGES - 1) % GEMM_STAGES, k + GEMM_STAGES - 1);
        cp_async_commit();
        const uint8_t* st = gemm_smem + (k % GEMM_STAGES) * SB;
        const uint32_t* sS = (const uint32_t*)(st + OFF_S);
        const uint32_t* sB = (const uint32_t*)(st + OFF_B);
        const float2* sXS = (const float2*)(st + OFF_XS);
        const float2* sXM = (const float2*)(st + OFF_XM);
#pragma unroll
        for (int gg = 0; gg < 2; gg++) {
            uint2 wa[2][2]; // [m tile][row gid, gid+8]: bytes 8t..8t+7 of the group
            float sc[2][2], bi[2][2];
#pragma unroll
            for (int mt = 0; mt < 2; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    int row = wm + mt * 16 + gid + 8 * h;
                    wa[mt][h] = *(const uint2*)(st + row * GEMM_WSTRIDE + gg * 32 + 8 * t);
                    sc[mt][h] = gemm_half(sS[row], gg);
                    bi[mt][h] = gemm_half(sB[row], gg);
                }
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                int j = wn + nt * 8 + gid; // the row this thread feeds into B
                const uint8_t* xr = st + OFF_X + j * GEMM_XSTRIDE + gg * 64 + 8 * t;
                uint2 lo = *(const uint2*)xr, hi = *(const uint2*)(xr + 32);
                int jr = wn + nt * 8 + 2 * t; // the rows of this thread's outputs: jr, jr+1
                float2 x0 = sXS[jr], x1 = sXS[jr + 1], m0s = sXM[jr], m1s = sXM[jr + 1];
                float xa = gg ? x0.y : x0.x, xb = gg ? x1.y : x1.x;
                float ma = gg ? m0s.y : m0s.x, mb = gg ? m1s.y : m1s.x;
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    int d[4] = {0, 0, 0, 0};
                    mma_s8(d, wa[mt][0].x & M, wa[mt][1].x & M, wa[mt][0].y & M, wa[mt][1].y & M, lo.x, lo.y);
                    mma_s8(d, (wa[mt][0].x >> 4) & M, (wa[mt][1].x >> 4) & M, (wa[mt][0].y >> 4) & M,
                           (wa[mt][1].y >> 4) & M, hi.x, hi.y);
                    float* a = acc[mt][nt];
                    a[0] = __fadd_rn(a[0], __fadd_rn(__fmul_rn(__int2float_rn(d[0]), __fmul_rn(sc[mt][0], xa)),
                                                     __fmul_rn(bi[mt][0], ma)));
                    a[1] = __fadd_rn(a[1], __fadd_rn(__fmul_rn(__int2float_rn(d[1]), __fmul_rn(sc[mt][0], xb)),
                                                     __fmul_rn(bi[mt][0], mb)));
                    a[2] = __fadd_rn(a[2], __fadd_rn(__fmul_rn(__int2float_rn(d[2]), __fmul_rn(sc[mt][1], xa)),
                                                     __fmul_rn(bi[mt][1], ma)));
                    a[3] = __fadd_rn(a[3], __fadd_rn(__fmul_rn(__int2float_rn(d[3]), __fmul_rn(sc[mt][1], xb)),
                                                     __fmul_rn(bi[mt][1], mb)));
                }
            }
        }
    }
    cp_async_wait<0>(); // nothing may be in flight when the block exits
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                int o = m0 + wm + mt * 16 + gid + 8 * (c >> 1);
                int j = wn + nt * 8 + 2 * t + (c & 1);
                if (o < O && j < n) out[(size_t)(rb + j * step) * O + o] = acc[mt][nt][c];
            }
}

// q4_gemm: blockIdx.x is a tile of BN activation rows, blockIdx.y one of
// GEMM_M outputs, in one of three modes:
//   - tiles == null, heads == 0: W·x over rows 0..nb-1, tile x the rows
//     x·BN..;
//   - tiles != null: the grouped products of a prefill chunk's experts,
//     tile x = tiles[x] = {e, first row, rows (<= BN), row step}, with
//     expert e's codes, scales and biases at tab[3e..3e+2];
//   - heads > 0: W a head at a time (W_k, W_v: tab[3h..] head h's rows,
//     the activations [nb][heads][C]), tile x = head x % heads over the
//     token rows (x / heads)·BN.., activation row = token·heads + head.
// Dynamic shared memory: GEMM_STAGES · gemm_stage_bytes(BN).
template <int BN>
__device__ __forceinline__ void q4_gemm(const unsigned long long* __restrict__ tab, const int4* __restrict__ tiles,
                                        const uint8_t* W, const uint16_t* scales, const uint16_t* biases,
                                        const int8_t* x8, const float* xs, const float* xsum, float* out, int O,
                                        int C, int nb, int heads) {
    int m0 = blockIdx.y * GEMM_M;
    int rb, n, step = 1;
    if (tiles != nullptr) {
        int4 tl = tiles[blockIdx.x];
        const unsigned long long* e = tab + 3 * (size_t)tl.x;
        W = (const uint8_t*)e[0];
        scales = (const uint16_t*)e[1];
        biases = (const uint16_t*)e[2];
        rb = tl.y, n = tl.z, step = tl.w;
    } else if (heads > 0) {
        int h = blockIdx.x % heads, i0 = (blockIdx.x / heads) * BN;
        const unsigned long long* e = tab + 3 * (size_t)h;
        W = (const uint8_t*)e[0];
        scales = (const uint16_t*)e[1];
        biases = (const uint16_t*)e[2];
        rb = i0 * heads + h, n = min(BN, nb - i0), step = heads;
    } else {
        rb = blockIdx.x * BN, n = min(BN, nb - rb);
    }
    if (n <= 0) return; // uniform: the whole block
    q4_tile<BN>(W, scales, biases, x8, xs, xsum, out, O, C, m0, rb, n, step);
}

