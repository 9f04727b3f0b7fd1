// Matrix products out[r][o] = W[o]·x[r] for the packed format's kinds.
//
// Layout (as internal/kernels): W is row-major [O][C], one row per output;
// activations x are [nb][C]; out is [nb][O]. Quantised kinds hold affine
// groups of 64 columns: w = scale·q + bias, scales and biases IEEE halves
// [O][C/64]; q4 packs group g of a row into 32 bytes, byte j holding q[j] in
// its low nibble and q[j+32] in its high nibble; q8 is one byte per weight.
//
// Batch invariance: one warp computes one output row o for R activation
// rows, and the arithmetic of each (r, o) is the same whatever R, the
// batch size or the grid: no split-K, no atomics. The variants with R = 1
// (decode) and R = 8 (prefill, verify) give identical bits.
#include "common.cuh"

// prep_x computes, per activation row and group of 64, the group sum of x
// (kernels.GroupSums: four strided chains, then (s0+s1)+(s2+s3)) and, when
// x8 is not null, the symmetric int8 quantisation of kernels.QuantizeRow8:
// xs = max|x|/127, x8 = round-to-even(x/xs) by the 1.5·2^23 trick. One
// thread per (row, group); total = nb·C/64. The loops unroll whole, so a
// group's sixteen loads are in flight together (a hidden row has only a
// few dozen groups: each thread's latency is the kernel's).
extern "C" __global__ void prep_x(const float* __restrict__ x, int8_t* __restrict__ x8,
                                  float* __restrict__ xs, float* __restrict__ xsum, int C, int total) {
    PDL_ENTRY
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= total) return;
    int ng = C >> 6;
    int r = t / ng, g = t - r * ng;
    const float* p = x + (size_t)r * C + g * 64;
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f, m = 0.0f;
#pragma unroll
    for (int j = 0; j < 64; j += 4) {
        float4 v = *(const float4*)(p + j);
        s0 = __fadd_rn(s0, v.x);
        s1 = __fadd_rn(s1, v.y);
        s2 = __fadd_rn(s2, v.z);
        s3 = __fadd_rn(s3, v.w);
        m = fmaxf(m, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    }
    xsum[t] = __fadd_rn(__fadd_rn(s0, s1), __fadd_rn(s2, s3));
    if (x8 == nullptr) return;
    float sc = __fdiv_rn(m, 127.0f);
    xs[t] = sc;
    float inv = sc > 0.0f ? __fdiv_rn(1.0f, sc) : 0.0f;
    const float magic = 12582912.0f;
    int8_t* d = x8 + (size_t)r * C + g * 64;
#pragma unroll
    for (int j = 0; j < 64; j += 4) {
        float4 v = *(const float4*)(p + j);
        char4 q;
        q.x = (signed char)(int)__fsub_rn(__fadd_rn(__fmul_rn(v.x, inv), magic), magic);
        q.y = (signed char)(int)__fsub_rn(__fadd_rn(__fmul_rn(v.y, inv), magic), magic);
        q.z = (signed char)(int)__fsub_rn(__fadd_rn(__fmul_rn(v.z, inv), magic), magic);
        q.w = (signed char)(int)__fsub_rn(__fadd_rn(__fmul_rn(v.w, inv), magic), magic);
        *(char4*)(d + j) = q;
    }
}

// group_term is one row's term of the group a lane pair took: the pair's
// integer sums added, then float(s)·(scale·xs) + bias·xsum, each operation
// rounded; 0 past the last group. Every lane of the warp calls it (the
// shuffle).
__device__ __forceinline__ float group_term(int s, bool valid, float sc, float bi, const float* __restrict__ xs,
                                            const float* __restrict__ xsum, size_t at) {
    s += __shfl_xor_sync(FULL_MASK, s, 1);
    if (!valid) return 0.0f;
    float c = __fmul_rn(sc, xs[at]);
    float t = __fmul_rn(__int2float_rn(s), c);
    float b = __fmul_rn(bi, xsum[at]);
    return __fadd_rn(t, b);
}

// chain_terms adds one step's group terms (n groups, 4·Q at most) to each
// row's sum in group order: the first lane of each group's 2^S lanes puts
// row r's terms e[r] in shared memory et, and lane r adds them to acc one
// by one.
template <int R, int S, int Q, int W>
__device__ __forceinline__ void chain_terms(float (*et)[W], const float (&e)[R], int lane, int n, float& acc) {
    if (!(lane & ((1 << S) - 1))) {
#pragma unroll
        for (int r = 0; r < R; r++) et[r][lane >> S] = e[r];
    }
    __syncwarp();
    if (lane < R) {
        const float4* p = (const float4*)et[lane];
#pragma unroll
        for (int q = 0; q < Q; q++) {
            float4 v = p[q];
            if (4 * q < n) acc = __fadd_rn(acc, v.x);
            if (4 * q + 1 < n) acc = __fadd_rn(acc, v.y);
            if (4 * q + 2 < n) acc = __fadd_rn(acc, v.z);
            if (4 * q + 3 < n) acc = __fadd_rn(acc, v.w);
        }
    }
    __syncwarp();
}

// q4_rows is the q4 product in the integer design of kernels.dotQ4I8,
// bit for bit: per group the exact int32 Σ q·x8 (dp4a), then
// acc = acc + (float(s)·(scale·xs) + bias·xsum), each operation rounded,
// groups in order. A warp reads a row in 512-byte steps: lane pair (2k,
// 2k+1) takes the two 16-byte halves of group g0+k; the pair's integer sums
// are added, and the group terms go through shared memory to lane r, which
// chains row r's in group order. Blocks are 256 threads (8 warps).
template <int R, int PRE>
__device__ __forceinline__ void q4_rows(const uint8_t* __restrict__ W, const uint16_t* __restrict__ scales,
                                        const uint16_t* __restrict__ biases, const int8_t* __restrict__ x8,
                                        const float* __restrict__ xs, const float* __restrict__ xsum,
                                        float* __restrict__ out, int O, int C, int nb) {
    int lane = threadIdx.x & 31;
    int o = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (o >= O) return; // whole warps
    int r0 = blockIdx.y * R;
    int ng = C >> 6;
    int half = lane & 1;
    const uint4* wrow = (const uint4*)(W + (size_t)o * (C >> 1));
    const uint16_t* srow = scales + (size_t)o * ng;
    const uint16_t* brow = biases + (size_t)o * ng;
    // Lane r < R holds row r's sum; et holds one step's group terms.
    __shared__ __align__(16) float ets[8][R][20];
    float(*et)[20] = ets[threadIdx.x >> 5];
    float acc = 0.0f;
    for (int g0 = 0; g0 < ng; g0 += 16 * PRE) {
        // Up to PRE 512-byte steps in flight before the first use.
        uint4 w[PRE];
        float sc[PRE], bi[PRE];
#pragma unroll
        for (int u = 0; u < PRE; u++) {
            int g = g0 + u * 16 + (lane >> 1);
            if (g < ng) {
                w[u] = __ldg(wrow + 2 * g + half);
                sc[u] = ld_half(srow + g);
                bi[u] = ld_half(brow + g);
            } else {
                w[u] = make_uint4(0, 0, 0, 0);
                sc[u] = 0.0f;
                bi[u] = 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < PRE; u++) {
            int gb = g0 + u * 16;
            if (gb >= ng) break; // uniform
            int g = gb + (lane >> 1);
            bool valid = g < ng;
            int n = min(16, ng - gb);
            uint32_t lo0 = w[u].x & 0x0f0f0f0fu, hi0 = (w[u].x >> 4) & 0x0f0f0f0fu;
            uint32_t lo1 = w[u].y & 0x0f0f0f0fu, hi1 = (w[u].y >> 4) & 0x0f0f0f0fu;
            uint32_t lo2 = w[u].z & 0x0f0f0f0fu, hi2 = (w[u].z >> 4) & 0x0f0f0f0fu;
            uint32_t lo3 = w[u].w & 0x0f0f0f0fu, hi3 = (w[u].w >> 4) & 0x0f0f0f0fu;
            // The group terms of every row first, then the chains (in
            // group order): the R chains are independent, so their
            // additions interleave, and the broadcasts do not wait on the
            // additions.
            float e[R];
#pragma unroll
            for (int r = 0; r < R; r++) {
                int row = r0 + r;
                e[r] = 0.0f;
                if (row >= nb) continue; // uniform
                int s = 0;
                if (valid) {
                    const int8_t* xr = x8 + (size_t)row * C + g * 64 + half * 16;
                    int4 xl = *(const int4*)xr;
                    int4 xh = *(const int4*)(xr + 32);
                    s = __dp4a((int)lo0, xl.x, s);
                    s = __dp4a((int)hi0, xh.x, s);
                    s = __dp4a((int)lo1, xl.y, s);
                    s = __dp4a((int)hi1, xh.y, s);
                    s = __dp4a((int)lo2, xl.z, s);
                    s = __dp4a((int)hi2, xh.z, s);
                    s = __dp4a((int)lo3, xl.w, s);
                    s = __dp4a((int)hi3, xh.w, s);
                }
                e[r] = group_term(s, valid, sc[u], bi[u], xs, xsum, (size_t)row * ng + g);
            }
            chain_terms<R, 1, 4, 20>(et, e, lane, n, acc);
        }
    }
    if (lane < R && r0 + lane < nb) out[(size_t)(r0 + lane) * O + o] = acc;
}

// q4_mv: one activation row per warp (grid.y = nb). Block: 256 threads =
// 8 output rows; grid.x = ceil(O/8).
extern "C" __global__ void __launch_bounds__(256) q4_mv(const uint8_t* W, const uint16_t* scales, const uint16_t* biases,
                                                        const int8_t* x8, const float* xs, const float* xsum,
                                                        float* out, int O, int C, int nb) {
    PDL_ENTRY
    q4_rows<1, 4>(W, scales, biases, x8, xs, xsum, out, O, C, nb);
}

// q4_mv2 is q4_mv with two steps in flight instead of four and a register
// budget for six blocks per SM (occupancy against loads in flight; the
// benchmark compares them). Same bits.
extern "C" __global__ void __launch_bounds__(256, 6) q4_mv2(const uint8_t* W, const uint16_t* scales, const uint16_t* biases,
                                                            const int8_t* x8, const float* xs, const float* xsum,
                                                            float* out, int O, int C, int nb) {
    PDL_ENTRY
    q4_rows<1, 2>(W, scales, biases, x8, xs, xsum, out, O, C, nb);
}

// q4_mm8: eight activation rows per warp (grid.y = ceil(nb/8)), each
// weight load reused eight times.
extern "C" __global__ void __launch_bounds__(256) q4_mm8(const uint8_t* W, const uint16_t* scales, const uint16_t* biases,
                                                         const int8_t* x8, const float* xs, const float* xsum,
                                                         float* out, int O, int C, int nb) {
    PDL_ENTRY
    q4_rows<8, 4>(W, scales, biases, x8, xs, xsum, out, O, C, nb);
}

// spread12 puts the four 3-bit values of v (value k at bits 3k) into the
// four bytes of a word (value k in byte k), as dp4a multiplies them.
__device__ __forceinline__ uint32_t spread12(uint32_t v) {
    return (v & 7u) | ((v & 0x38u) << 5) | ((v & 0x1c0u) << 10) | ((v & 0xe00u) << 15);
}

// spread8 is spread12 for four 2-bit values (value k at bits 2k).
__device__ __forceinline__ uint32_t spread8(uint32_t v) {
    return (v & 3u) | ((v & 0xcu) << 6) | ((v & 0x30u) << 12) | ((v & 0xc0u) << 18);
}

// low_rows is the product of a low-bit record (format.Q3, format.Q2: the
// lossy copies that --miss-bits reads): a group's 64 values packed B bits
// each, value i at bit B·i of the group's 8·B bytes, with the q4 format's
// scales and biases. The activations are prepared as for q4, and the
// arithmetic after each group's integer sum is q4_rows', operation for
// operation; that sum is exact whatever its order, so the result is the
// bits q4_rows gives on the record widened to q4 (each value in a nibble),
// which is what the CPU's low-bit kernels give too. Lane pair (2k, 2k+1)
// takes the two 32-value halves of group g0+k.
template <int B, int R, int PRE>
__device__ __forceinline__ void low_rows(const uint8_t* __restrict__ W, const uint16_t* __restrict__ scales,
                                         const uint16_t* __restrict__ biases, const int8_t* __restrict__ x8,
                                         const float* __restrict__ xs, const float* __restrict__ xsum,
                                         float* __restrict__ out, int O, int C, int nb) {
    int lane = threadIdx.x & 31;
    int o = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (o >= O) return; // whole warps
    int r0 = blockIdx.y * R;
    int ng = C >> 6;
    int half = lane & 1;
    // A half group is 4·B bytes: B words, 4-byte aligned.
    const uint32_t* wrow = (const uint32_t*)(W + (size_t)o * ng * (8 * B));
    const uint16_t* srow = scales + (size_t)o * ng;
    const uint16_t* brow = biases + (size_t)o * ng;
    __shared__ __align__(16) float ets[8][R][20];
    float(*et)[20] = ets[threadIdx.x >> 5];
    float acc = 0.0f;
    for (int g0 = 0; g0 < ng; g0 += 16 * PRE) {
        uint32_t w[PRE][B];
        float sc[PRE], bi[PRE];
#pragma unroll
        for (int u = 0; u < PRE; u++) {
            int g = g0 + u * 16 + (lane >> 1);
#pragma unroll
            for (int i = 0; i < B; i++) w[u][i] = g < ng ? __ldg(wrow + (2 * g + half) * B + i) : 0u;
            sc[u] = g < ng ? ld_half(srow + g) : 0.0f;
            bi[u] = g < ng ? ld_half(brow + g) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < PRE; u++) {
            int gb = g0 + u * 16;
            if (gb >= ng) break; // uniform
            int g = gb + (lane >> 1);
            bool valid = g < ng;
            int n = min(16, ng - gb);
            // q[j] holds values 4j..4j+3 of the lane's 32, a byte each.
            uint32_t q[8];
            if constexpr (B == 3) {
                uint32_t a = w[u][0], b = w[u][1], c = w[u][2];
                q[0] = spread12(a & 0xfffu);
                q[1] = spread12((a >> 12) & 0xfffu);
                q[2] = spread12(__funnelshift_r(a, b, 24) & 0xfffu);
                q[3] = spread12((b >> 4) & 0xfffu);
                q[4] = spread12((b >> 16) & 0xfffu);
                q[5] = spread12(__funnelshift_r(b, c, 28) & 0xfffu);
                q[6] = spread12((c >> 8) & 0xfffu);
                q[7] = spread12(c >> 20);
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++) q[j] = spread8((w[u][j >> 2] >> (8 * (j & 3))) & 0xffu);
            }
            float e[R];
#pragma unroll
            for (int r = 0; r < R; r++) {
                int row = r0 + r;
                e[r] = 0.0f;
                if (row >= nb) continue; // uniform
                int s = 0;
                if (valid) {
                    const int8_t* xr = x8 + (size_t)row * C + g * 64 + half * 32;
                    int4 xa = *(const int4*)xr;
                    int4 xb = *(const int4*)(xr + 16);
                    s = __dp4a((int)q[0], xa.x, s);
                    s = __dp4a((int)q[1], xa.y, s);
                    s = __dp4a((int)q[2], xa.z, s);
                    s = __dp4a((int)q[3], xa.w, s);
                    s = __dp4a((int)q[4], xb.x, s);
                    s = __dp4a((int)q[5], xb.y, s);
                    s = __dp4a((int)q[6], xb.z, s);
                    s = __dp4a((int)q[7], xb.w, s);
                }
                e[r] = group_term(s, valid, sc[u], bi[u], xs, xsum, (size_t)row * ng + g);
            }
            chain_terms<R, 1, 4, 20>(et, e, lane, n, acc);
        }
    }
    if (lane < R && r0 + lane < nb) out[(size_t)(r0 + lane) * O + o] = acc;
}

// q3_mv, q3_mm8, q2_mv, q2_mm8: low_rows for one activation row per warp
// and for eight (grid and blocks as q4_mv and q4_mm8).
extern "C" __global__ void __launch_bounds__(256, 6) q3_mv(const uint8_t* W, const uint16_t* scales, const uint16_t* biases,
                                                           const int8_t* x8, const float* xs, const float* xsum,
                                                           float* out, int O, int C, int nb) {
    PDL_ENTRY
    low_rows<3, 1, 2>(W, scales, biases, x8, xs, xsum, out, O, C, nb);
}

extern "C" __global__ void __launch_bounds__(256) q3_mm8(const uint8_t* W, const uint16_t* scales, const uint16_t* biases,
                                                         const int8_t* x8, const float* xs, const float* xsum,
                                                         float* out, int O, int C, int nb) {
    PDL_ENTRY
    low_rows<3, 8, 4>(W, scales, biases, x8, xs, xsum, out, O, C, nb);
}

extern "C" __global__ void __launch_bounds__(256, 6) q2_mv(const uint8_t* W, const uint16_t* scales, const uint16_t* biases,
                                                           const int8_t* x8, const float* xs, const float* xsum,
                                                           float* out, int O, int C, int nb) {
    PDL_ENTRY
    low_rows<2, 1, 2>(W, scales, biases, x8, xs, xsum, out, O, C, nb);
}

extern "C" __global__ void __launch_bounds__(256) q2_mm8(const uint8_t* W, const uint16_t* scales, const uint16_t* biases,
                                                         const int8_t* x8, const float* xs, const float* xsum,
                                                         float* out, int O, int C, int nb) {
    PDL_ENTRY
    low_rows<2, 8, 4>(W, scales, biases, x8, xs, xsum, out, O, C, nb);
}

// q8_rows: float activations, as kernels.dotQ8: per group
// acc += scale·Σq·x + bias·xsum. A lane takes 16 weights (a quarter
// group); the four quarters are added by a fixed butterfly, and the group
// terms chained in group order. Not bit-identical to the CPU (whose vector
// lanes order the 64 products differently): within float32 rounding.
template <int R>
__device__ __forceinline__ void q8_rows(const uint8_t* __restrict__ W, const uint16_t* __restrict__ scales,
                                        const uint16_t* __restrict__ biases, const float* __restrict__ x,
                                        const float* __restrict__ xsum, float* __restrict__ out, int O, int C, int nb) {
    int lane = threadIdx.x & 31;
    int o = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (o >= O) return;
    int r0 = blockIdx.y * R;
    int ng = C >> 6;
    int quarter = lane & 3;
    const uint4* wrow = (const uint4*)(W + (size_t)o * C);
    __shared__ __align__(16) float ets[8][R][12];
    float(*et)[12] = ets[threadIdx.x >> 5];
    float acc = 0.0f;
    for (int gb = 0; gb < ng; gb += 8) {
        int g = gb + (lane >> 2);
        bool valid = g < ng;
        int n = min(8, ng - gb);
        uint4 w = valid ? __ldg(wrow + 4 * g + quarter) : make_uint4(0, 0, 0, 0);
        float sc = valid ? ld_half(scales + (size_t)o * ng + g) : 0.0f;
        float bi = valid ? ld_half(biases + (size_t)o * ng + g) : 0.0f;
        float wf[16];
        uint32_t ww[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int i = 0; i < 16; i++) wf[i] = (float)((ww[i >> 2] >> (8 * (i & 3))) & 0xffu);
        float e[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            int row = r0 + r;
            e[r] = 0.0f;
            if (row >= nb) continue; // uniform
            float p = 0.0f;
            if (valid) {
                const float4* xr = (const float4*)(x + (size_t)row * C + g * 64 + quarter * 16);
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float4 v = xr[i];
                    p = fmaf(wf[4 * i], v.x, p);
                    p = fmaf(wf[4 * i + 1], v.y, p);
                    p = fmaf(wf[4 * i + 2], v.z, p);
                    p = fmaf(wf[4 * i + 3], v.w, p);
                }
            }
            p = __fadd_rn(p, __shfl_xor_sync(FULL_MASK, p, 1));
            p = __fadd_rn(p, __shfl_xor_sync(FULL_MASK, p, 2));
            if (valid) e[r] = __fadd_rn(__fmul_rn(sc, p), __fmul_rn(bi, xsum[(size_t)row * ng + g]));
        }
        chain_terms<R, 2, 2, 12>(et, e, lane, n, acc);
    }
    if (lane < R && r0 + lane < nb) out[(size_t)(r0 + lane) * O + o] = acc;
}

extern "C" __global__ void __launch_bounds__(256) q8_mv(const uint8_t* W, const uint16_t* scales, const uint16_t* biases,
                                                        const float* x, const float* xsum, float* out, int O, int C, int nb) {
    PDL_ENTRY
    q8_rows<1>(W, scales, biases, x, xsum, out, O, C, nb);
}

extern "C" __global__ void __launch_bounds__(256) q8_mm8(const uint8_t* W, const uint16_t* scales, const uint16_t* biases,
                                                         const float* x, const float* xsum, float* out, int O, int C, int nb) {
    PDL_ENTRY
    q8_rows<8>(W, scales, biases, x, xsum, out, O, C, nb);
}

// bf16_rows: a lane takes 8 weights (16 bytes) per 256-column step and
// accumulates with fmaf; the lanes are added by warp_sum32. C must be a
// multiple of 8. Within float32 rounding of the CPU's dotBF16.
template <int R>
__device__ __forceinline__ void bf16_rows(const uint16_t* __restrict__ W, const float* __restrict__ x,
                                          float* __restrict__ out, int O, int C, int nb) {
    int lane = threadIdx.x & 31;
    int o = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (o >= O) return;
    int r0 = blockIdx.y * R;
    const uint4* wrow = (const uint4*)(W + (size_t)o * C);
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    for (int c = lane * 8; c < C; c += 256) {
        uint4 w = __ldg(wrow + (c >> 3));
        float wf[8];
        uint32_t ww[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            wf[2 * i] = __int_as_float(ww[i] << 16);
            wf[2 * i + 1] = __int_as_float(ww[i] & 0xffff0000u);
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (r0 + r >= nb) break;
            const float4* xr = (const float4*)(x + (size_t)(r0 + r) * C + c);
            float4 v0 = xr[0], v1 = xr[1];
            float a = acc[r];
            a = fmaf(wf[0], v0.x, a);
            a = fmaf(wf[1], v0.y, a);
            a = fmaf(wf[2], v0.z, a);
            a = fmaf(wf[3], v0.w, a);
            a = fmaf(wf[4], v1.x, a);
            a = fmaf(wf[5], v1.y, a);
            a = fmaf(wf[6], v1.z, a);
            a = fmaf(wf[7], v1.w, a);
            acc[r] = a;
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        if (r0 + r >= nb) break;
        float s = warp_sum32(acc[r]);
        if (lane == 0) out[(size_t)(r0 + r) * O + o] = s;
    }
}

extern "C" __global__ void __launch_bounds__(256) bf16_mv(const uint16_t* W, const float* x, float* out, int O, int C, int nb) {
    PDL_ENTRY
    bf16_rows<1>(W, x, out, O, C, nb);
}

extern "C" __global__ void __launch_bounds__(256) bf16_mm8(const uint16_t* W, const float* x, float* out, int O, int C, int nb) {
    PDL_ENTRY
    bf16_rows<8>(W, x, out, O, C, nb);
}

// q4_mma is the batched q4 product on int8 tensor cores, with q4_rows's
// bits: a group of 64 is two k=32 slices (the low nibbles of its 32 bytes
// are q[0..31], the high ones q[32..63], matching x8's two halves), so two
// mma give the exact int32 Σ q·x8 of a 16 (outputs) x 8 (activation rows)
// tile, and each thread chains the float terms of its four (output, row)
// pairs in group order. Warp = 16 output rows x 8 activation rows; block =
// 4 warps; grid = (ceil(O/64), ceil(nb/8)).
extern "C" __global__ void __launch_bounds__(128) q4_mma(const uint8_t* __restrict__ W, const uint16_t* __restrict__ scales,
                                                         const uint16_t* __restrict__ biases, const int8_t* __restrict__ x8,
                                                         const float* __restrict__ xs, const float* __restrict__ xsum,
                                                         float* __restrict__ out, int O, int C, int nb) {
    PDL_ENTRY
    int lane = threadIdx.x & 31;
    int m0 = (blockIdx.x * 4 + (threadIdx.x >> 5)) * 16;
    if (m0 >= O) return; // whole warps
    int n0 = blockIdx.y * 8;
    int gid = lane >> 2, t = lane & 3;
    int ng = C >> 6;
    int oA = m0 + gid, oB = m0 + gid + 8;
    bool vA = oA < O, vB = oB < O;
    int rx = n0 + gid; // the activation row this thread feeds into B
    bool vx = rx < nb;
    int r0 = n0 + 2 * t, r1 = r0 + 1; // the activation rows of its outputs
    bool v0 = r0 < nb, v1 = r1 < nb;
    const uint32_t* wA = (const uint32_t*)(W + (size_t)(vA ? oA : 0) * (C >> 1));
    const uint32_t* wB = (const uint32_t*)(W + (size_t)(vB ? oB : 0) * (C >> 1));
    const uint32_t* xw = (const uint32_t*)(x8 + (size_t)(vx ? rx : 0) * C);
    const uint16_t* sA = scales + (size_t)(vA ? oA : 0) * ng;
    const uint16_t* sB = scales + (size_t)(vB ? oB : 0) * ng;
    const uint16_t* bA = biases + (size_t)(vA ? oA : 0) * ng;
    const uint16_t* bB = biases + (size_t)(vB ? oB : 0) * ng;
    const float* xs0 = xs + (size_t)(v0 ? r0 : 0) * ng;
    const float* xs1 = xs + (size_t)(v1 ? r1 : 0) * ng;
    const float* xm0 = xsum + (size_t)(v0 ? r0 : 0) * ng;
    const float* xm1 = xsum + (size_t)(v1 ? r1 : 0) * ng;
    float acc00 = 0.0f, acc01 = 0.0f, acc10 = 0.0f, acc11 = 0.0f; // (oA,r0) (oA,r1) (oB,r0) (oB,r1)
    const uint32_t M = 0x0f0f0f0fu;
#pragma unroll 4
    for (int g = 0; g < ng; g++) {
        uint32_t a0 = __ldg(wA + g * 8 + t), a2 = __ldg(wA + g * 8 + 4 + t);
        uint32_t a1 = __ldg(wB + g * 8 + t), a3 = __ldg(wB + g * 8 + 4 + t);
        uint32_t b0 = __ldg(xw + g * 16 + t), b1 = __ldg(xw + g * 16 + 4 + t);
        uint32_t b2 = __ldg(xw + g * 16 + 8 + t), b3 = __ldg(xw + g * 16 + 12 + t);
        int d[4] = {0, 0, 0, 0};
        mma_s8(d, a0 & M, a1 & M, a2 & M, a3 & M, b0, b1);
        mma_s8(d, (a0 >> 4) & M, (a1 >> 4) & M, (a2 >> 4) & M, (a3 >> 4) & M, b2, b3);
        float scA = ld_half(sA + g), scB = ld_half(sB + g), biA = ld_half(bA + g), biB = ld_half(bB + g);
        float x0 = __ldg(xs0 + g), x1 = __ldg(xs1 + g), m0s = __ldg(xm0 + g), m1s = __ldg(xm1 + g);
        acc00 = __fadd_rn(acc00, __fadd_rn(__fmul_rn(__int2float_rn(d[0]), __fmul_rn(scA, x0)), __fmul_rn(biA, m0s)));
        acc01 = __fadd_rn(acc01, __fadd_rn(__fmul_rn(__int2float_rn(d[1]), __fmul_rn(scA, x1)), __fmul_rn(biA, m1s)));
        acc10 = __fadd_rn(acc10, __fadd_rn(__fmul_rn(__int2float_rn(d[2]), __fmul_rn(scB, x0)), __fmul_rn(biB, m0s)));
        acc11 = __fadd_rn(acc11, __fadd_rn(__fmul_rn(__int2float_rn(d[3]), __fmul_rn(scB, x1)), __fmul_rn(biB, m1s)));
    }
    if (vA && v0) out[(size_t)r0 * O + oA] = acc00;
    if (vA && v1) out[(size_t)r1 * O + oA] = acc01;
    if (vB && v0) out[(size_t)r0 * O + oB] = acc10;
    if (vB && v1) out[(size_t)r1 * O + oB] = acc11;
}

// The expert products of a decode step, for replay from a graph (no host
// round trip for the router's choice): slot k = blockIdx.y multiplies the
// matrix of expert ids[k], whose addresses are tab[3·ids[k] ..] (codes,
// scales, biases; bf16: values), with activation row k (xsel 1) or row 0
// (xsel 0: every slot reads the layer's input) into out row k. The rows
// are those of the one-row kernels (q4_mv2, q8_mv, bf16_mv), so the bits
// are theirs: the templates address row r0 = blockIdx.y, and the
// activations are offset back by k rows when every slot reads row 0.
extern "C" __global__ void __launch_bounds__(256, 6) q4_ex(const unsigned long long* __restrict__ tab,
                                                           const int* __restrict__ ids, const int8_t* x8,
                                                           const float* xs, const float* xsum, float* out, int O,
                                                           int C, int nk, int xsel) {
    PDL_ENTRY
    int k = blockIdx.y;
    const unsigned long long* t = tab + 3 * (size_t)ids[k];
    size_t back = xsel ? 0 : (size_t)k;
    size_t ng = C >> 6;
    q4_rows<1, 2>((const uint8_t*)t[0], (const uint16_t*)t[1], (const uint16_t*)t[2], x8 - back * C, xs - back * ng,
                  xsum - back * ng, out, O, C, nk);
}

extern "C" __global__ void __launch_bounds__(256) q8_ex(const unsigned long long* __restrict__ tab,
                                                        const int* __restrict__ ids, const float* x,
                                                        const float* xsum, float* out, int O, int C, int nk,
                                                        int xsel) {
    PDL_ENTRY
    int k = blockIdx.y;
    const unsigned long long* t = tab + 3 * (size_t)ids[k];
    size_t back = xsel ? 0 : (size_t)k;
    size_t ng = C >> 6;
    q8_rows<1>((const uint8_t*)t[0], (const uint16_t*)t[1], (const uint16_t*)t[2], x - back * C, xsum - back * ng, out, O, C,
               nk);
}

extern "C" __global__ void __launch_bounds__(256) bf16_ex(const unsigned long long* __restrict__ tab,
                                                          const int* __restrict__ ids, const float* x, float* out,
                                                          int O, int C, int nk, int xsel) {
    PDL_ENTRY
    int k = blockIdx.y;
    const unsigned long long* t = tab + 3 * (size_t)ids[k];
    size_t back = xsel ? 0 : (size_t)k;
    bf16_rows<1>((const uint16_t*)t[0], x - back * C, out, O, C, nk);
}

#include "gemm.cuh"

// q4_gemm32 and q4_gemm64: q4_gemm with tiles of 32 and 64 rows.
#define Q4_GEMM(R)                                                                                              \
    extern "C" __global__ void __launch_bounds__(GEMM_THREADS)                                                  \
        q4_gemm##R(const unsigned long long* tab, const int4* tiles, const uint8_t* W, const uint16_t* scales, \
                   const uint16_t* biases, const int8_t* x8, const float* xs, const float* xsum, float* out,    \
                   int O, int C, int nb, int heads) {                                                           \
        PDL_ENTRY                                                                                               \
        q4_gemm<R>(tab, tiles, W, scales, biases, x8, xs, xsum, out, O, C, nb, heads);                          \
    }
Q4_GEMM(32)
Q4_GEMM(64)
