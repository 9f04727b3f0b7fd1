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
    for (int j = warp; j < n; j += ATT_THREADS / 32) {
        const float* kj = kb + (size_t)j * kvw;
        float p = 0.0f;
        for (int d = lane; d < hd; d += 32) p = fmaf(qs[d], kj[d], p);
        p = warp_sum32(p);
        if (lane == 0) sc[j] = __fmul_rn(p, scale);
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
    for (int d = tid; d < hd; d += ATT_THREADS) {
        float a = 0.0f;
        const float* vd = vb + d;
        int j = 0;
        // Two independent loads per step keep the loop from waiting on
        // each load in turn; the sum itself stays one chain in order.
        for (; j + 2 <= n; j += 2) {
            float v0 = vd[(size_t)j * kvw], v1 = vd[(size_t)(j + 1) * kvw];
            a = fmaf(sc[j], v0, a);
            a = fmaf(sc[j + 1], v1, a);
        }
        if (j < n) a = fmaf(sc[j], vd[(size_t)j * kvw], a);
        float r = __fmul_rn(a, inv);
        if (gated) r = __fmul_rn(r, sl_sigmoid(gp[d]));
        op[d] = r;
    }
}
