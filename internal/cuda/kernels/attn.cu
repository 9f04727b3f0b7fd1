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
// Split over positions in chunks of a fixed ATT_CHUNK (never a fixed
// number of chunks), so a row's arithmetic depends only on its own
// position. attend_part: one block of 128 threads per (head, row, chunk)
// computes the chunk's scores s_j = scale·(q·k_j) (one warp per position,
// lanes over dims, butterfly sum), its max m_c, e_j = Exp(s_j − m_c)
// (kernels.Exp), l_c = Σe (a fixed 128-way split and tree) and o_c = Σ e_j·v_j
// (one thread per dim, positions in order). attend_combine: per (head,
// row), M = max m_c, w_c = Exp(m_c − M), o = (Σ_c w_c·o_c)·(1/Σ_c w_c·l_c)
// in chunk order, and with the gate o·sigmoid(g).
//
// Latent attention (DeepSeek's MLA, absorbed) is one kv head whose value
// is the first vd dims of the key (vc = kc, vd < hd): o_c and o hold vd
// floats. With sel set (the indexer's choice), row i attends to the
// min(n, topk) positions sel[i·topk + j], ascending, in that order, and the
// chunks split that list.
//
// A sliding window (win > 0) restricts row i to positions n−win..n−1, n =
// pos+i+1: a chunk keeps its place, only the positions before the window
// drop out of it. A ring cache (ring > 0 rows) holds position j at row
// j % ring (model.State's ring). A sink (per head, sinks not null) joins
// the combine's max and denominator with no value (gpt-oss), as
// kernels.AttendRing.
#include "common.cuh"

#define ATT_THREADS 128
#define ATT_CHUNK 256
#define ATT_MAX_CHUNKS 1024

// How a chunk finds its positions' cache rows. The mode is a template
// parameter, so that a plain cache's loops carry no branch and no modulo
// per load (the inner loops issue one load per position and dim).
enum { ROWS_PLAIN, ROWS_RING, ROWS_SEL };

// att_row is the cache row of the chunk's j-th position, relative to the
// chunk's base: plain, j (the base is the chunk's first row); a ring, the
// first position's row r1 = j1 % ring plus j, wrapped once (a chunk spans
// at most ring positions: the window is no longer than the ring); selected,
// rs[j] (rs is the row's list from the chunk's first entry).
template <int MODE>
__device__ __forceinline__ size_t att_row(const int* __restrict__ rs, int r1, int ring, int j) {
    if (MODE == ROWS_SEL) return (size_t)rs[j];
    if (MODE == ROWS_RING) {
        int r = r1 + j;
        return (size_t)(r >= ring ? r - ring : r);
    }
    return (size_t)j;
}

// attend_chunk is attend_part's work on one (head, row, chunk) once the
// chunk's positions are known: kb and vb point at the kv head's first
// float in the chunk's base row, qs holds the query.
template <int MODE>
__device__ __forceinline__ void attend_chunk(float* __restrict__ pp, const float* __restrict__ qs,
                                             const float* __restrict__ kb, const float* __restrict__ vb,
                                             const int* __restrict__ rs, int r1, int ring, int len, int hd, int kvw,
                                             float scale, int vd, float* sc, float* red) {
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
#define ROW(j) (att_row<MODE>(rs, r1, ring, (j)) * (size_t)kvw)
    // Four positions per warp at a time: their loads are in flight
    // together. Each score is still one lane split and one butterfly.
    for (int j0 = 4 * warp; j0 < len; j0 += 4 * (ATT_THREADS / 32)) {
        float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int d = lane; d < hd; d += 32) {
            float qd = qs[d];
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (j0 + u < len) p[u] = fmaf(qd, kb[ROW(j0 + u) + d], p[u]);
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            float t = warp_sum32(p[u]);
            if (lane == 0 && j0 + u < len) sc[j0 + u] = __fmul_rn(t, scale);
        }
    }
    __syncthreads();
    float m = __int_as_float(0xff800000);
    for (int j = tid; j < len; j += ATT_THREADS) m = fmaxf(m, sc[j]);
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) m = fmaxf(m, __shfl_xor_sync(FULL_MASK, m, s));
    if (lane == 0) red[warp] = m;
    __syncthreads();
    m = fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3]));
    __syncthreads();
    float l = 0.0f;
    for (int j = tid; j < len; j += ATT_THREADS) {
        float e = sl_exp(__fsub_rn(sc[j], m));
        sc[j] = e;
        l = __fadd_rn(l, e);
    }
    l = warp_sum32(l);
    if (lane == 0) red[warp] = l;
    __syncthreads();
    l = __fadd_rn(__fadd_rn(red[0], red[1]), __fadd_rn(red[2], red[3]));
    if (tid == 0) {
        pp[vd] = m;
        pp[vd + 1] = l;
    }
    // Each dim is one chain over the chunk's positions in order, eight
    // loads in flight per step.
    for (int d = tid; d < vd; d += ATT_THREADS) {
        float a = 0.0f;
        int j = 0;
        for (; j + 8 <= len; j += 8) {
            float v[8];
#pragma unroll
            for (int u = 0; u < 8; u++) v[u] = vb[ROW(j + u) + d];
#pragma unroll
            for (int u = 0; u < 8; u++) a = fmaf(sc[j + u], v[u], a);
        }
        for (; j < len; j++) a = fmaf(sc[j], vb[ROW(j) + d], a);
        pp[d] = a;
    }
#undef ROW
}

// With posp set, pos is read from the device (a step replayed from a
// graph) and nc, the grid's chunk count, covers the longest context; the
// chunks past a row's position return at once, as they always did. gate
// (att_skip) lets a recorded latent attention launch this kernel beside
// mla_attend_wide, each taking the depths it is faster at.
//
// part holds, per (row, head, chunk), vd floats of o_c, then m_c and l_c:
// part + ((i·nh + h)·nc + c)·(vd+2); nc = chunks of the longest row.
extern "C" __global__ void __launch_bounds__(ATT_THREADS)
attend_part(float* __restrict__ part, const float* __restrict__ q, const float* __restrict__ kc,
            const float* __restrict__ vc, int pos, int nh, int nkv, int hd, int qRow, int qHead, int kvw, float scale,
            int nc, const int* __restrict__ posp, int win, int ring, int vd, const int* __restrict__ sel, int topk,
            int gate) {
    PDL_ENTRY
    if (posp != nullptr) pos = *posp; // a recorded step reads its position on the device
    if (att_skip(gate, pos, gridDim.y, sel != nullptr ? topk : 0, ATT_CHUNK)) return;
    extern __shared__ float qs[]; // [hd]
    __shared__ float sc[ATT_CHUNK];
    __shared__ float red[ATT_THREADS / 32];
    int h = blockIdx.x, i = blockIdx.y, c = blockIdx.z;
    int n = pos + i + 1;
    if (sel != nullptr) n = min(n, topk);
    int lo = win > 0 ? max(n - win, 0) : 0;
    int jc = c * ATT_CHUNK;
    if (jc >= n || jc + ATT_CHUNK <= lo) return; // whole blocks
    int j1 = max(jc, lo);                           // the chunk's first position in the window
    int len = min(jc + ATT_CHUNK, n) - j1;
    const float* qp = q + (size_t)i * qRow + (size_t)h * qHead;
    for (int d = threadIdx.x; d < hd; d += ATT_THREADS) qs[d] = qp[d];
    __syncthreads();
    int g = h / (nh / nkv);
    const float* kb = kc + (size_t)g * hd;
    const float* vb = vc + (size_t)g * hd;
    float* pp = part + ((size_t)(i * nh + h) * nc + c) * (vd + 2);
    if (sel != nullptr)
        attend_chunk<ROWS_SEL>(pp, qs, kb, vb, sel + (size_t)i * topk + j1, 0, 0, len, hd, kvw, scale, vd, sc, red);
    else if (ring > 0)
        attend_chunk<ROWS_RING>(pp, qs, kb, vb, nullptr, j1 % ring, ring, len, hd, kvw, scale, vd, sc, red);
    else
        attend_chunk<ROWS_PLAIN>(pp, qs, kb + (size_t)j1 * kvw, vb + (size_t)j1 * kvw, nullptr, 0, 0, len, hd, kvw,
                                 scale, vd, sc, red);
}

extern "C" __global__ void __launch_bounds__(ATT_THREADS)
attend_combine(float* __restrict__ o, const float* __restrict__ part, const float* __restrict__ q, int pos, int nh,
               int hd, int qRow, int qHead, int oRow, int nc, int gated, const int* __restrict__ posp, int win,
               const float* __restrict__ sinks, int vd, int topk) {
    PDL_ENTRY
    if (posp != nullptr) pos = *posp;
    __shared__ float w[ATT_MAX_CHUNKS];
    __shared__ float inv;
    int h = blockIdx.x, i = blockIdx.y;
    int n = pos + i + 1;
    if (topk > 0) n = min(n, topk); // the selected positions
    int cn = (n + ATT_CHUNK - 1) / ATT_CHUNK;
    int c0 = win > 0 ? max(n - win, 0) / ATT_CHUNK : 0; // the window's first chunk
    const float* pb = part + (size_t)(i * nh + h) * nc * (vd + 2);
    float M = __int_as_float(0xff800000);
    for (int c = c0; c < cn; c++) M = fmaxf(M, pb[(size_t)c * (vd + 2) + vd]);
    if (sinks != nullptr) M = fmaxf(M, sinks[h]);
    for (int c = c0 + threadIdx.x; c < cn; c += ATT_THREADS) w[c] = sl_exp(__fsub_rn(pb[(size_t)c * (vd + 2) + vd], M));
    __syncthreads();
    if (threadIdx.x == 0) {
        float L = 0.0f;
        for (int c = c0; c < cn; c++) L = fmaf(w[c], pb[(size_t)c * (vd + 2) + vd + 1], L);
        if (sinks != nullptr) L = __fadd_rn(L, sl_exp(__fsub_rn(sinks[h], M)));
        inv = __fdiv_rn(1.0f, L);
    }
    __syncthreads();
    const float* gp = q + (size_t)i * qRow + (size_t)h * qHead + hd;
    float* op = o + (size_t)i * oRow + (size_t)h * vd;
    for (int d = threadIdx.x; d < vd; d += ATT_THREADS) {
        float a = 0.0f;
        for (int c = c0; c < cn; c++) a = fmaf(w[c], pb[(size_t)c * (vd + 2) + d], a);
        float r = __fmul_rn(a, inv);
        if (gated) r = __fmul_rn(r, sl_sigmoid(gp[d]));
        op[d] = r;
    }
}
