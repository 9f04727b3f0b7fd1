// Causal attention over a KV cache, for decode and prefill alike: query row
// i of a step at position pos+i attends to cache positions 0..pos+i, which
// must already hold this step's keys and values (the cache is appended
// before attention, so cached and new positions are reduced in one order).
//
// Layout (as internal/model): q row i, head h at q + i·qRow + h·qHead
// (qHead = 2·hd when each head's query is followed by its output gate);
// the cache holds position j's kv head g at kc + j·kvw + g·hd; o row i,
// head h at o + i·oRow + h·hd. Grouped-query: head h reads kv head
// h/(nh/nkv).
//
// One block of 128 threads per (head, row): scores s_j = scale·(q·k_j) one
// warp per position (lanes over dims, butterfly sum), the max, e_j =
// Exp(s_j − max) (kernels.Exp), Σe in a fixed 128-way split and tree, then
// o = (Σ_j e_j·v_j)·(1/Σe) one thread per dim in position order, and with
// gate o·sigmoid(g). The order of every sum is fixed by the position and the
// dims alone. Scores live in dynamic shared memory: 4·(pos+nb) + 4·hd + 512
// bytes.
#include "common.cuh"

#define ATT_THREADS 128

extern "C" __global__ void __launch_bounds__(ATT_THREADS)
attend(float* __restrict__ o, const float* __restrict__ q, const float* __restrict__ kc, const float* __restrict__ vc,
       int pos, int nh, int nkv, int hd, int qRow, int qHead, int kvw, int oRow, float scale, int gated) {
    extern __shared__ float sm[];
    int h = blockIdx.x, i = blockIdx.y;
    int n = pos + i + 1;
    float* qs = sm;            // [hd]
    float* red = sm + hd;      // [128]
    float* sc = red + ATT_THREADS; // [n]
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const float* qp = q + (size_t)i * qRow + (size_t)h * qHead;
    for (int d = tid; d < hd; d += ATT_THREADS) qs[d] = qp[d];
    __syncthreads();
    int g = h / (nh / nkv);
    const float* kb = kc + (size_t)g * hd;
    const float* vb = vc + (size_t)g * hd;
    // Four positions per warp at a time: their loads are in flight
    // together. Each score is still one lane split and one butterfly.
    for (int j0 = 4 * warp; j0 < n; j0 += 4 * (ATT_THREADS / 32)) {
        float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int d = lane; d < hd; d += 32) {
            float qd = qs[d];
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (j0 + u < n) p[u] = fmaf(qd, kb[(size_t)(j0 + u) * kvw + d], p[u]);
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            float t = warp_sum32(p[u]);
            if (lane == 0 && j0 + u < n) sc[j0 + u] = __fmul_rn(t, scale);
        }
    }
    __syncthreads();
    float m = __int_as_float(0xff800000);
    for (int j = tid; j < n; j += ATT_THREADS) m = fmaxf(m, sc[j]);
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) m = fmaxf(m, __shfl_xor_sync(FULL_MASK, m, s));
    if (lane == 0) red[warp] = m;
    __syncthreads();
    m = fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3]));
    __syncthreads();
    float part = 0.0f;
    for (int j = tid; j < n; j += ATT_THREADS) {
        float e = sl_exp(__fsub_rn(sc[j], m));
        sc[j] = e;
        part = __fadd_rn(part, e);
    }
    part = warp_sum32(part);
    if (lane == 0) red[warp] = part;
    __syncthreads();
    float sum = __fadd_rn(__fadd_rn(red[0], red[1]), __fadd_rn(red[2], red[3]));
    float inv = __fdiv_rn(1.0f, sum);
    float* op = o + (size_t)i * oRow + (size_t)h * hd;
    const float* gp = qp + hd;
    // Two dims per thread (d and d+128) and eight positions per step in
    // flight; each output is one chain over the positions in order.
    for (int d0 = tid; d0 < hd; d0 += 2 * ATT_THREADS) {
        int d1 = d0 + ATT_THREADS;
        bool two = d1 < hd;
        float a0 = 0.0f, a1 = 0.0f;
        int j = 0;
        for (; j + 8 <= n; j += 8) {
            float v0[8], v1[8];
#pragma unroll
            for (int u = 0; u < 8; u++) {
                v0[u] = vb[(size_t)(j + u) * kvw + d0];
                v1[u] = two ? vb[(size_t)(j + u) * kvw + d1] : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < 8; u++) {
                a0 = fmaf(sc[j + u], v0[u], a0);
                a1 = fmaf(sc[j + u], v1[u], a1);
            }
        }
        for (; j < n; j++) {
            a0 = fmaf(sc[j], vb[(size_t)j * kvw + d0], a0);
            if (two) a1 = fmaf(sc[j], vb[(size_t)j * kvw + d1], a1);
        }
        float r0 = __fmul_rn(a0, inv);
        if (gated) r0 = __fmul_rn(r0, sl_sigmoid(gp[d0]));
        op[d0] = r0;
        if (two) {
            float r1 = __fmul_rn(a1, inv);
            if (gated) r1 = __fmul_rn(r1, sl_sigmoid(gp[d1]));
            op[d1] = r1;
        }
    }
}
