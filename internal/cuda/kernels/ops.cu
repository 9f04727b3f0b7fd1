// Row-wise and element-wise ops: RMSNorm (with the fused residual add),
// RoPE, SwiGLU, the router's softmax and top-k, greedy argmax, and the
// DeltaNet's per-row preparation. Each row is computed by one warp or one
// block in a fixed order, so a row's bits never depend on the batch.
#include "common.cuh"

// sum_squares32 is kernels.sumSquares for one warp over x[0..n): whole
// 32-float blocks put element i into lane i%32, the rest of the row into
// lanes 0..7 (element n32+t into lane t%8), each lane in index order; then
// lanes32_sum. Every lane returns the total.
__device__ __forceinline__ float sum_squares32(const float* x, int n) {
    int lane = threadIdx.x & 31;
    int n32 = n & ~31;
    float a = 0.0f;
    int i = lane;
    // Eight loads in flight before their adds, which keep their order: a
    // row of thousands is otherwise one load's latency per 32 floats.
    for (; i + 7 * 32 < n32; i += 8 * 32) {
        float v[8];
#pragma unroll
        for (int u = 0; u < 8; u++) v[u] = x[i + 32 * u];
#pragma unroll
        for (int u = 0; u < 8; u++) a = __fadd_rn(a, __fmul_rn(v[u], v[u]));
    }
    for (; i < n32; i += 32) {
        float v = x[i];
        a = __fadd_rn(a, __fmul_rn(v, v));
    }
    if (lane < 8)
        for (int i = n32 + lane; i < n; i += 8) {
            float v = x[i];
            a = __fadd_rn(a, __fmul_rn(v, v));
        }
    return lanes32_sum(a);
}

// rmsnorm: for each of rows rows of n floats, stride floats apart:
// x += add (when add is not null; written back, as the residual), then
// dst = x/rms(x)·w, or ·(1+w) when zc (zero-centred). As kernels.RMSNorm
// after kernels.Add. One warp per row; dst may be x.
extern "C" __global__ void rmsnorm(float* dst, float* x, const float* __restrict__ add, const float* __restrict__ w,
                                   int rows, int n, int stride, float eps, int zc) {
    PDL_ENTRY
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    int lane = threadIdx.x & 31;
    float* xr = x + (size_t)row * stride;
    float* dr = dst + (size_t)row * stride;
    if (add != nullptr) {
        const float* ar = add + (size_t)row * stride;
        int i = lane;
        for (; i + 7 * 32 < n; i += 8 * 32) { // eight loads of each in flight
            float v[8], b[8];
#pragma unroll
            for (int u = 0; u < 8; u++) v[u] = xr[i + 32 * u], b[u] = ar[i + 32 * u];
#pragma unroll
            for (int u = 0; u < 8; u++) xr[i + 32 * u] = __fadd_rn(v[u], b[u]);
        }
        for (; i < n; i += 32) xr[i] = __fadd_rn(xr[i], ar[i]);
        __syncwarp();
    }
    float ss = sum_squares32(xr, n);
    float inv = (float)(1.0 / sqrt((double)__fadd_rn(__fdiv_rn(ss, (float)n), eps)));
    int i = lane;
    for (; i + 7 * 32 < n; i += 8 * 32) {
        float v[8], g[8];
#pragma unroll
        for (int u = 0; u < 8; u++) v[u] = xr[i + 32 * u], g[u] = w[i + 32 * u];
#pragma unroll
        for (int u = 0; u < 8; u++) dr[i + 32 * u] = __fmul_rn(__fmul_rn(v[u], inv), zc ? __fadd_rn(1.0f, g[u]) : g[u]);
    }
    for (; i < n; i += 32) {
        float v = __fmul_rn(xr[i], inv);
        float g = zc ? __fadd_rn(1.0f, w[i]) : w[i];
        dr[i] = __fmul_rn(v, g);
    }
}

// rmsnorm_block is rmsnorm for long rows, one block of NORM_THREADS per
// row: the block loads the row (and adds the residual) into shared memory,
// all its loads in flight at once; one warp sums the squares from there,
// in rmsnorm's order (sum_squares32, so the bits are rmsnorm's); then the
// block scales the row. rmsnorm's single warp waits on a load's latency
// for every 256 floats of each of its three passes. sh holds n floats.
#define NORM_THREADS 256
extern "C" __global__ void __launch_bounds__(NORM_THREADS)
rmsnorm_block(float* dst, float* x, const float* __restrict__ add, const float* __restrict__ w, int n, int stride,
              float eps, int zc) {
    PDL_ENTRY
    extern __shared__ float sh[];
    __shared__ float sinv;
    int tid = threadIdx.x;
    float* xr = x + (size_t)blockIdx.x * stride;
    float* dr = dst + (size_t)blockIdx.x * stride;
    const float* ar = add != nullptr ? add + (size_t)blockIdx.x * stride : nullptr;
    for (int i0 = tid; i0 < n; i0 += 8 * NORM_THREADS) { // eight loads of each in flight
        float v[8], b[8];
#pragma unroll
        for (int u = 0; u < 8; u++) {
            int i = i0 + u * NORM_THREADS;
            v[u] = i < n ? xr[i] : 0.0f;
            b[u] = i < n && ar != nullptr ? ar[i] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 8; u++) {
            int i = i0 + u * NORM_THREADS;
            if (i < n) {
                if (ar != nullptr) {
                    v[u] = __fadd_rn(v[u], b[u]);
                    xr[i] = v[u];
                }
                sh[i] = v[u];
            }
        }
    }
    __syncthreads();
    if (tid < 32) {
        float ss = sum_squares32(sh, n);
        if (tid == 0) sinv = (float)(1.0 / sqrt((double)__fadd_rn(__fdiv_rn(ss, (float)n), eps)));
    }
    __syncthreads();
    float inv = sinv;
    for (int i = tid; i < n; i += NORM_THREADS) {
        float g = zc ? __fadd_rn(1.0f, w[i]) : w[i];
        dr[i] = __fmul_rn(__fmul_rn(sh[i], inv), g);
    }
}

// rope applies rotate-half rotary embedding to the first 2·rh dims of nh
// head vectors per row: vector (r, h) starts at x + r·rowStride +
// h·headStride; cos and sin are [nb][rh] (the host's tables, from
// kernels.RopeTable). As kernels.Rope. One thread per (row, head, i).
extern "C" __global__ void rope(float* x, const float* __restrict__ cos, const float* __restrict__ sin, int nb, int nh,
                                int rowStride, int headStride, int rh) {
    PDL_ENTRY
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= nb * nh * rh) return;
    int i = t % rh;
    int v = t / rh;
    int h = v % nh, r = v / nh;
    float* p = x + (size_t)r * rowStride + (size_t)h * headStride;
    float c = cos[r * rh + i], s = sin[r * rh + i];
    float x1 = p[i], x2 = p[rh + i];
    p[i] = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
    p[rh + i] = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
}

// swiglu: dst = silu(gate)·up over n floats, as kernels.SwiGLU.
extern "C" __global__ void swiglu(float* dst, const float* gate, const float* up, int n) {
    PDL_ENTRY
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = __fmul_rn(sl_silu(gate[i]), up[i]);
}

// route: per row, the softmax of E router logits (kernels.Softmax: max,
// e = Exp(x-max), the sum in 8 lanes by index mod 8 then hsum8, x·(1/sum))
// into probs (which may be logits), then the top k as model.Route: in order
// of probability, ties to the lower id; with norm, weights divided by their
// sum (summed in order). ids are int32 [nb][k], w [nb][k]. One warp per row;
// probs is left with the chosen entries overwritten by -1.
extern "C" __global__ void route(const float* logits, float* probs, int* __restrict__ ids, float* __restrict__ wts,
                                 int nb, int E, int K, int norm) {
    PDL_ENTRY
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= nb) return;
    int lane = threadIdx.x & 31;
    const float* lr = logits + (size_t)row * E;
    float* pr = probs + (size_t)row * E;
    float m = lr[0];
    for (int i = lane; i < E; i += 32) m = fmaxf(m, lr[i]);
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) m = fmaxf(m, __shfl_xor_sync(FULL_MASK, m, s));
    for (int i = lane; i < E; i += 32) pr[i] = sl_exp(__fsub_rn(lr[i], m));
    __syncwarp();
    float a = 0.0f;
    if (lane < 8)
        for (int i = lane; i < E; i += 8) a = __fadd_rn(a, pr[i]);
    float inv = __fdiv_rn(1.0f, hsum8_lanes(a));
    __syncwarp();
    for (int i = lane; i < E; i += 32) pr[i] = __fmul_rn(pr[i], inv);
    __syncwarp();
    float sum = 0.0f;
    for (int k = 0; k < K; k++) {
        // A candidate is above -1: the chosen entries (-1) and NaN are not.
        float bv = -1.0f;
        int bi = 0x7fffffff;
        for (int i = lane; i < E; i += 32) {
            float v = pr[i];
            if (v > bv) bv = v, bi = i;
        }
#pragma unroll
        for (int s = 16; s > 0; s >>= 1) {
            float ov = __shfl_xor_sync(FULL_MASK, bv, s);
            int oi = __shfl_xor_sync(FULL_MASK, bi, s);
            if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
        }
        if (bi == 0x7fffffff) {
            // No candidate: a NaN logit made every probability NaN. Take
            // the lowest entry not chosen yet, so that the ids stay distinct
            // and in range (an id past E would address memory outside the
            // experts'); the forward's logits come out NaN, which the caller
            // refuses.
            bi = E;
            for (int i = lane; i < E; i += 32)
                if (pr[i] != -1.0f) {
                    bi = i;
                    break;
                }
#pragma unroll
            for (int s = 16; s > 0; s >>= 1) bi = min(bi, __shfl_xor_sync(FULL_MASK, bi, s));
            bv = pr[bi];
        }
        if (lane == 0) {
            ids[row * K + k] = bi;
            wts[row * K + k] = bv;
            pr[bi] = -1.0f;
        }
        sum = __fadd_rn(sum, bv);
        __syncwarp();
    }
    if (norm && lane < K) wts[row * K + lane] = __fdiv_rn(wts[row * K + lane], sum);
}

// NONE is "no entry" in a warp's search for its best.
#define NONE 0x7fffffff

// beats reports whether the candidate (v, i) ranks above (bv, bi) in a
// search for the best: the larger value, ties to the lower index, NaN
// below every number and NONE below everything. The order is total, so
// that every lane of a warp agrees on one best even where a corrupt
// model's values are NaN (with the plain comparison each lane would keep
// its own, and the ids would repeat).
__device__ __forceinline__ bool beats(float v, int i, float bv, int bi) {
    if (i == NONE) return false;
    if (bi == NONE) return true;
    bool vn = isnan(v), bn = isnan(bv);
    if (vn != bn) return bn;
    if (vn) return i < bi;
    return v > bv || (v == bv && i < bi);
}

// warp_best reduces the lanes' candidates (bv, bi; bi == NONE: none) to
// the warp's best by beats. Every lane returns it.
__device__ __forceinline__ void warp_best(float& bv, int& bi) {
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) {
        float ov = __shfl_xor_sync(FULL_MASK, bv, s);
        int oi = __shfl_xor_sync(FULL_MASK, bi, s);
        if (beats(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
}

// pick_next is one step of a warp's top-k over E entries, as model.Route
// takes them: the best entry not chosen yet (chosen holds this lane's
// entries lane + 32·j as bit j) among those val(i, v) gives a value v for
// (it returns false to skip one), ties to the lower index. It marks the
// entry chosen and returns it, its value in best; every lane gets both.
template <typename F>
__device__ __forceinline__ int pick_next(int E, unsigned& chosen, F val, float& best) {
    int lane = threadIdx.x & 31;
    float bv = __int_as_float(0xff800000);
    int bi = NONE;
    for (int i = lane, j = 0; i < E; i += 32, j++) {
        float v;
        if (((chosen >> j) & 1) || !val(i, v)) continue;
        if (beats(v, i, bv, bi)) bv = v, bi = i;
    }
    warp_best(bv, bi);
    if (bi == NONE) bi = 0; // every entry chosen or skipped
    if ((bi & 31) == lane) chosen |= 1u << (bi >> 5);
    best = bv;
    return bi;
}

// route_groups: per row, DeepSeek-V3's router as model.RouteGroups: p =
// sigmoid(logit) into probs (which may be logits); choice = p + corr; with
// G > TG groups, each group scored by the sum of its two best choices and
// the TG best groups kept (ties to the lower group); the top K of the kept
// choices (ties to the lower id), weighted by their p, divided by their sum
// (plus 1e-20, summed in order) when norm, then times scale. One warp per
// row; E is at most 1024 (a lane's chosen entries are bits of one word), G
// at most 64.
extern "C" __global__ void route_groups(const float* logits, float* probs, const float* __restrict__ corr,
                                        int* __restrict__ ids, float* __restrict__ wts, int nb, int E, int K, int G,
                                        int TG, int norm, float scale) {
    PDL_ENTRY
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= nb) return;
    int lane = threadIdx.x & 31;
    const float* lr = logits + (size_t)row * E;
    float* pr = probs + (size_t)row * E;
    for (int i = lane; i < E; i += 32) pr[i] = sl_sigmoid(lr[i]);
    __syncwarp();
    const float ninf = __int_as_float(0xff800000);
    int gs = E / G;
    unsigned long long keep = ~0ull;
    if (G > 1 && TG < G) {
        float sc[2] = {ninf, ninf}; // groups lane and lane+32
        for (int g = lane, j = 0; g < G; g += 32, j++) {
            float a = ninf, b = ninf;
            for (int e = g * gs; e < (g + 1) * gs; e++) {
                float v = __fadd_rn(pr[e], corr[e]);
                if (v > a) b = a, a = v;
                else if (v > b) b = v;
            }
            sc[j] = __fadd_rn(a, b);
        }
        keep = 0;
        for (int t = 0; t < TG; t++) {
            float bv = ninf;
            int bi = NONE;
            if (lane < G && !((keep >> lane) & 1)) bv = sc[0], bi = lane;
            if (lane + 32 < G && !((keep >> (lane + 32)) & 1) && beats(sc[1], lane + 32, bv, bi)) bv = sc[1], bi = lane + 32;
            warp_best(bv, bi);
            if (bi != NONE) keep |= 1ull << bi;
        }
    }
    unsigned chosen = 0; // bit j: entry lane + 32·j
    float sum = 0.0f;
    for (int k = 0; k < K; k++) {
        float bv;
        int bi = pick_next(
            E, chosen,
            [&](int i, float& v) {
                if (!((keep >> (i / gs)) & 1)) return false; // a dropped group
                v = __fadd_rn(pr[i], corr[i]);
                return true;
            },
            bv);
        float p = pr[bi];
        if (lane == 0) ids[row * K + k] = bi, wts[row * K + k] = p;
        sum = __fadd_rn(sum, p);
    }
    __syncwarp();
    if (lane < K) {
        float w = wts[row * K + lane];
        if (norm) w = __fdiv_rn(w, __fadd_rn(sum, 1e-20f));
        wts[row * K + lane] = __fmul_rn(w, scale);
    }
}

// route_topk: per row, gpt-oss's router (block.TopKSoftmax): the top k of
// E logits (model.Route: in order, ties to the lower id), then
// kernels.Softmax over those k (max, Exp(x−max), the sum in 8 lanes by
// index mod 8 then hsum8, x·(1/sum)). One warp per row; the logits are
// left as they were.
extern "C" __global__ void route_topk(const float* __restrict__ logits, int* __restrict__ ids, float* __restrict__ wts,
                                      int nb, int E, int K) {
    PDL_ENTRY
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= nb) return;
    int lane = threadIdx.x & 31;
    const float* lr = logits + (size_t)row * E;
    unsigned chosen = 0; // bit j: entry lane + 32·j
    float mine = 0.0f;   // lane k < K: the k-th choice's logit
    for (int k = 0; k < K; k++) {
        float bv;
        int bi = pick_next(
            E, chosen,
            [&](int i, float& v) {
                v = lr[i];
                return true;
            },
            bv);
        if (lane == k) mine = bv;
        if (lane == 0) ids[row * K + k] = bi;
    }
    float m = __shfl_sync(FULL_MASK, mine, 0);
    for (int k = 1; k < K; k++) m = fmaxf(m, __shfl_sync(FULL_MASK, mine, k));
    float e = lane < K ? sl_exp(__fsub_rn(mine, m)) : 0.0f;
    float a = 0.0f; // lane l < 8: the sum of e_k for k ≡ l mod 8, in order
    for (int k = 0; k < K; k++) {
        float ek = __shfl_sync(FULL_MASK, e, k);
        if ((k & 7) == lane) a = __fadd_rn(a, ek);
    }
    float inv = __fdiv_rn(1.0f, hsum8_lanes(a));
    if (lane < K) wts[row * K + lane] = __fmul_rn(e, inv);
}

// clamped_swiglu: gpt-oss's expert activation, as kernels.ClampedSwiGLU:
// g = min(gate, 7), u = clamp(up, ±7), dst = (u+1)·(g·sigmoid(1.702·g)).
extern "C" __global__ void clamped_swiglu(float* dst, const float* gate, const float* up, int n) {
    PDL_ENTRY
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = fminf(gate[i], 7.0f);
    float u = fminf(fmaxf(up[i], -7.0f), 7.0f);
    dst[i] = __fmul_rn(__fadd_rn(u, 1.0f), __fmul_rn(g, sl_sigmoid(__fmul_rn(g, 1.702f))));
}

// add_ex: the expert biases of a recorded step: out row k += the bias
// vector tab[ids[k]][which] (O floats; none where the address is 0), as
// add_rows adds each expert's.
extern "C" __global__ void add_ex(float* out, const unsigned long long* __restrict__ tab, const int* __restrict__ ids,
                                  int which, int O, int nk) {
    PDL_ENTRY
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= nk * O) return;
    const float* b = (const float*)tab[3 * (size_t)ids[t / O] + which];
    if (b != nullptr) out[t] = __fadd_rn(out[t], b[t % O]);
}

// add_rows: x row r += b for rows rows of n floats (the projections'
// biases), as kernels.Add.
extern "C" __global__ void add_rows(float* x, const float* __restrict__ b, int rows, int n) {
    PDL_ENTRY
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= rows * n) return;
    x[t] = __fadd_rn(x[t], b[t % n]);
}

// argmax: per row of V logits the index of the largest, ties to the lowest
// index (as sample's greedy argmax). A row whose largest logit is not
// finite (every one NaN or -Inf, or the largest +Inf) gives -1: the forward
// computed garbage, which the caller reports rather than choose a token,
// as the CPU refuses such a choice.
// One block of 1024 threads per row. A row is a few hundred KB that one
// multiprocessor reads: each thread keeps 4 loads (of 4 floats where the
// row allows) in flight before comparing, so that the block waits for
// memory a dozen times instead of once per element. A thread visits its
// elements in increasing index order, so a strict > keeps its lowest
// index of a tie, and the reductions break ties by index.
#define ARGMAX_THREADS 1024
#define ARGMAX_TAKE(v, i) \
    if ((v) > bv) bv = (v), bi = (i);

extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS) argmax(const float* __restrict__ x, int* __restrict__ out,
                                                                    int V) {
    PDL_ENTRY
    const float* xr = x + (size_t)blockIdx.x * V;
    const int T = blockDim.x;
    float bv = __int_as_float(0xff800000);
    int bi = 0x7fffffff;
    int i = threadIdx.x;
    if ((V & 3) == 0 && ((uintptr_t)xr & 15) == 0) {
        // Thread t takes float4 q = t, t+T, ...: elements 4q..4q+3.
        const float4* x4 = (const float4*)xr;
        int n4 = V >> 2;
        for (; i + 3 * T < n4; i += 4 * T) {
            float4 v[4];
#pragma unroll
            for (int u = 0; u < 4; u++) v[u] = x4[i + u * T];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                int e = 4 * (i + u * T);
                ARGMAX_TAKE(v[u].x, e)
                ARGMAX_TAKE(v[u].y, e + 1)
                ARGMAX_TAKE(v[u].z, e + 2)
                ARGMAX_TAKE(v[u].w, e + 3)
            }
        }
        for (; i < n4; i += T) {
            float4 v = x4[i];
            ARGMAX_TAKE(v.x, 4 * i)
            ARGMAX_TAKE(v.y, 4 * i + 1)
            ARGMAX_TAKE(v.z, 4 * i + 2)
            ARGMAX_TAKE(v.w, 4 * i + 3)
        }
    } else {
        for (; i + 3 * T < V; i += 4 * T) {
            float v[4];
#pragma unroll
            for (int u = 0; u < 4; u++) v[u] = xr[i + u * T];
#pragma unroll
            for (int u = 0; u < 4; u++) ARGMAX_TAKE(v[u], i + u * T)
        }
        for (; i < V; i += T) ARGMAX_TAKE(xr[i], i)
    }
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) {
        float ov = __shfl_xor_sync(FULL_MASK, bv, s);
        int oi = __shfl_xor_sync(FULL_MASK, bi, s);
        if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
    }
    __shared__ float sv[32];
    __shared__ int si[32];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) sv[warp] = bv, si[warp] = bi;
    __syncthreads();
    if (warp == 0) {
        int nw = blockDim.x >> 5;
        bv = lane < nw ? sv[lane] : __int_as_float(0xff800000);
        bi = lane < nw ? si[lane] : 0x7fffffff;
#pragma unroll
        for (int s = 16; s > 0; s >>= 1) {
            float ov = __shfl_xor_sync(FULL_MASK, bv, s);
            int oi = __shfl_xor_sync(FULL_MASK, bi, s);
            if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
        }
        if (lane == 0) out[blockIdx.x] = bi == 0x7fffffff || isinf(bv) ? -1 : bi;
    }
}

// dn_qk_norm: the DeltaNet's per-head L2 norms of q and k in the conv
// output qkv ([nb][2·nk·dk + nv·dv]): q = q/‖q‖·qscale, k = k/‖k‖, with
// ‖x‖ = sqrt(Σx²+eps) summed as kernels.L2Norm. One warp per (row, key
// head), rows = nb·nk.
extern "C" __global__ void dn_qk_norm(float* qkv, int rows, int nk, int dk, int cd, float eps, float qscale) {
    PDL_ENTRY
    int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (t >= rows) return;
    int lane = threadIdx.x & 31;
    int r = t / nk, h = t - r * nk;
    float* q = qkv + (size_t)r * cd + h * dk;
    float* k = qkv + (size_t)r * cd + nk * dk + h * dk;
    float iq = (float)(1.0 / sqrt((double)__fadd_rn(sum_squares32(q, dk), eps)));
    float ik = (float)(1.0 / sqrt((double)__fadd_rn(sum_squares32(k, dk), eps)));
    __syncwarp();
    for (int i = lane; i < dk; i += 32) {
        q[i] = __fmul_rn(__fmul_rn(q[i], iq), qscale);
        k[i] = __fmul_rn(k[i], ik);
    }
}

// dn_gates turns the b and a projections ([nb][nv]) into beta =
// sigmoid(b) and decay = exp(-exp(A_log)·softplus(a + dt_bias)) in place,
// with the CPU's float64 steps (model.dnPrep); softplus is linear above 20.
extern "C" __global__ void dn_gates(float* b, float* a, const float* __restrict__ alog, const float* __restrict__ dtBias,
                                    int nb, int nv) {
    PDL_ENTRY
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= nb * nv) return;
    int h = t % nv;
    b[t] = sl_sigmoid(b[t]);
    float x = __fadd_rn(a[t], dtBias[h]);
    float sp = x > 20.0f ? x : (float)log1p(exp((double)x));
    float na = -(float)exp((double)alog[h]);
    a[t] = (float)exp((double)__fmul_rn(na, sp));
}
