// DeepSeek's multi-head latent attention, run absorbed as the CPU runs it
// (internal/model/mla.go), and DeepSeek-V3.2's lightning indexer. The
// attention itself is attn.cu's over one kv head (the latent), whose value
// is the latent's first kvl dims; these kernels do what comes before and
// after it and choose the positions it reads.
//
// Layouts, per row i: q [heads][nope+rope]; the absorbed query qabs
// [heads][kvl+rope]; the latent attention's output olat [heads][kvl]; o
// [heads][v]. W_k and W_v, per head, are products of the pack's kinds
// (matvec.cu's expert kernels, a head a slot, or fwd.cu's head_f32).
#include "common.cuh"

// layer_norm: dst = (x − mean)/sqrt(var + eps)·w + b over rows of n floats
// (the biased variance, as torch's LayerNorm). One warp per row, eight
// rows a block; dst may be x.
extern "C" __global__ void __launch_bounds__(256)
layer_norm(float* dst, const float* x, const float* __restrict__ w, const float* __restrict__ b, int rows, int n,
           float eps) {
    PDL_ENTRY
    int lane = threadIdx.x & 31;
    int r = blockIdx.x * 8 + (threadIdx.x >> 5);
    if (r >= rows) return;
    const float* xr = x + (size_t)r * n;
    float* dr = dst + (size_t)r * n;
    float s = 0.0f;
    for (int c = lane; c < n; c += 32) s = __fadd_rn(s, xr[c]);
    float mean = __fdiv_rn(warp_sum32(s), (float)n);
    float v = 0.0f;
    for (int c = lane; c < n; c += 32) {
        float d = __fsub_rn(xr[c], mean);
        v = __fadd_rn(v, __fmul_rn(d, d));
    }
    float var = __fdiv_rn(warp_sum32(v), (float)n);
    float inv = (float)(1.0 / sqrt((double)__fadd_rn(var, eps)));
    for (int c = lane; c < n; c += 32) dr[c] = __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(xr[c], mean), inv), w[c]), b[c]);
}

// index_scores: for row i (at position pos+i, n = pos+i+1 positions) and
// each position t < n, sc[i·stride + t] = Σ_h (w[i][h]·wscale)·relu(scale·
// q[i][h]·k[t]), heads in order, where q is [rows][heads][dim] and k the
// indexer's key cache [positions][dim]. Rows with n ≤ topk attend to every
// position and score nothing. One warp per position (lanes over dim, a
// butterfly sum per head), eight per block; grid (⌈positions/8⌉, rows).
// With posp set, pos is read from the device (a recorded step).
extern "C" __global__ void __launch_bounds__(256)
index_scores(float* __restrict__ sc, const float* __restrict__ q, const float* __restrict__ k,
             const float* __restrict__ w, int pos, const int* __restrict__ posp, int heads, int dim, float scale,
             float wscale, int topk, int stride) {
    PDL_ENTRY
    if (posp != nullptr) pos = *posp;
    int lane = threadIdx.x & 31;
    int t = blockIdx.x * 8 + (threadIdx.x >> 5), i = blockIdx.y;
    int n = pos + i + 1;
    if (n <= topk || t >= n) return;
    const float* kt = k + (size_t)t * dim;
    const float* qi = q + (size_t)i * heads * dim;
    const float* wi = w + (size_t)i * heads;
    float s = 0.0f;
    for (int h = 0; h < heads; h++) {
        float d = 0.0f;
        for (int c = lane; c < dim; c += 32) d = fmaf(qi[(size_t)h * dim + c], kt[c], d);
        d = __fmul_rn(warp_sum32(d), scale);
        s = __fadd_rn(s, __fmul_rn(__fmul_rn(wi[h], wscale), fmaxf(d, 0.0f)));
    }
    if (lane == 0) sc[(size_t)i * stride + t] = s;
}

// key orders floats as unsigned integers: a larger float, a larger key.
__device__ __forceinline__ unsigned key(float f) {
    unsigned u = __float_as_uint(f == 0.0f ? 0.0f : f); // -0 is +0, as the CPU compares them
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

#define SEL_THREADS 256

// block_prefix is, for a flag each thread of a SEL_THREADS block holds,
// how many threads before this one hold it (the return) and how many in
// all (*all): one ballot a warp, then the warps' counts through cnt.
// Every thread of the block must call it; it syncs twice.
__device__ __forceinline__ int block_prefix(bool flag, int* cnt, int* all) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    unsigned b = __ballot_sync(FULL_MASK, flag);
    if (lane == 0) cnt[warp] = __popc(b);
    __syncthreads();
    int before = __popc(b & ((1u << lane) - 1)), n = 0;
    for (int x = 0; x < SEL_THREADS / 32; x++) {
        if (x < warp) before += cnt[x];
        n += cnt[x];
    }
    __syncthreads(); // cnt is read before the next call writes it
    *all = n;
    return before;
}

// index_select writes row i's topk best positions by score (the lower
// position first on ties: model.TopK's choice) into sel[i·topk ..] in
// ascending order, or every position 0..n-1 while n ≤ topk. One block per
// row: a radix select of the topk-th largest key, 8 bits a pass, then
// one pass in position order that keeps the keys above it and the first
// of those equal to it.
extern "C" __global__ void __launch_bounds__(SEL_THREADS)
index_select(int* __restrict__ sel, const float* __restrict__ sc, int pos, const int* __restrict__ posp, int topk,
             int stride) {
    PDL_ENTRY
    if (posp != nullptr) pos = *posp;
    __shared__ unsigned hist[256];
    __shared__ unsigned sprefix, swant;
    __shared__ int cnt[SEL_THREADS / 32];
    int i = blockIdx.x, tid = threadIdx.x;
    int n = pos + i + 1;
    int* out = sel + (size_t)i * topk;
    if (n <= topk) {
        for (int t = tid; t < n; t += SEL_THREADS) out[t] = t;
        return;
    }
    const float* s = sc + (size_t)i * stride;
    // want: the rank, among the keys that match prefix under mask, of the
    // topk-th largest key.
    unsigned prefix = 0, mask = 0, want = topk;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = tid; b < 256; b += SEL_THREADS) hist[b] = 0;
        __syncthreads();
        for (int t = tid; t < n; t += SEL_THREADS) {
            unsigned u = key(s[t]);
            if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 255], 1u);
        }
        __syncthreads();
        if (tid == 0) {
            unsigned above = 0;
            int b = 255;
            for (; b > 0 && above + hist[b] < want; b--) above += hist[b];
            swant = want - above;
            sprefix = prefix | ((unsigned)b << shift);
        }
        __syncthreads();
        want = swant;
        prefix = sprefix;
        mask |= 255u << shift;
        __syncthreads();
    }
    // prefix is the topk-th largest key; keep every key above it and the
    // first want keys equal to it, in position order.
    int taken = 0, eqSeen = 0;
    for (int t0 = 0; t0 < n; t0 += SEL_THREADS) {
        int t = t0 + tid;
        unsigned u = t < n ? key(s[t]) : 0;
        bool eq = t < n && u == prefix;
        int eqAll, all;
        int eqBefore = eqSeen + block_prefix(eq, cnt, &eqAll);
        bool take = (t < n && u > prefix) || (eq && eqBefore < (int)want);
        int at = taken + block_prefix(take, cnt, &all);
        if (take) out[at] = t;
        taken += all;
        eqSeen += eqAll;
    }
}

// mla_attend_part runs 128 threads a block, mla_attend_wide 512: a
// decode step's few blocks (a group of heads a chunk) keep more of each SM
// busy with 512, a prefill chunk's many do better with 128. Either way the
// chunk's sum of e_j runs on 128 threads, attend_part's split.
#define MLA_SUM 128
#define MLA_CHUNK 256 // attn.cu's ATT_CHUNK: the combine reads the same parts
#define MLA_HEADS 8   // the most heads a block takes

// mla_chunk is mla_attend_part's work on one (head group, row, chunk)
// once its positions are known: kc is the latent of the chunk's first row
// (plain) or of row 0 (SEL, rs the row's list from the chunk's first entry).
// SEL is a template parameter so that the plain cache's loops carry no
// branch per load (attn.cu's attend_chunk, for the same reason).
template <bool SEL, int THREADS>
__device__ __forceinline__ void mla_chunk(float* __restrict__ part, const float* __restrict__ qs,
                                          const float* __restrict__ kc, const int* __restrict__ rs, int len, int hd,
                                          int vd, float scale, int nhb, int h0, int i, int nh, int nc, int c,
                                          float (*sc)[MLA_CHUNK], float (*red)[THREADS / 32]) {
    constexpr int MLA_THREADS = THREADS, MLA_WARPS = THREADS / 32;
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
#define LROW(j) ((SEL ? (size_t)rs[j] : (size_t)(j)) * hd)
    // Scores: four positions per warp at a time, every head of the block
    // on each loaded element.
    for (int j0 = 4 * warp; j0 < len; j0 += 4 * MLA_WARPS) {
        float p[4][MLA_HEADS];
#pragma unroll
        for (int u = 0; u < 4; u++)
#pragma unroll
            for (int b = 0; b < MLA_HEADS; b++) p[u][b] = 0.0f;
        for (int d = lane; d < hd; d += 32) {
            float k[4];
#pragma unroll
            for (int u = 0; u < 4; u++) k[u] = j0 + u < len ? kc[LROW(j0 + u) + d] : 0.0f;
#pragma unroll
            for (int b = 0; b < MLA_HEADS; b++) {
                if (b < nhb) {
                    float qd = qs[b * hd + d];
#pragma unroll
                    for (int u = 0; u < 4; u++) p[u][b] = fmaf(qd, k[u], p[u][b]);
                }
            }
        }
#pragma unroll
        for (int b = 0; b < MLA_HEADS; b++) {
            if (b < nhb) {
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    float t = warp_sum32(p[u][b]);
                    if (lane == 0 && j0 + u < len) sc[b][j0 + u] = __fmul_rn(t, scale);
                }
            }
        }
    }
    __syncthreads();
    // Per head: the chunk's max, e_j and their sum, as attend_part.
    float ms[MLA_HEADS], ls[MLA_HEADS];
    for (int b = 0; b < nhb; b++) {
        float m = __int_as_float(0xff800000);
        for (int j = tid; j < len; j += MLA_THREADS) m = fmaxf(m, sc[b][j]);
#pragma unroll
        for (int s = 16; s > 0; s >>= 1) m = fmaxf(m, __shfl_xor_sync(FULL_MASK, m, s));
        if (lane == 0) red[b][warp] = m;
    }
    __syncthreads();
    for (int b = 0; b < nhb; b++) {
        float m = red[b][0];
        for (int w = 1; w < MLA_WARPS; w++) m = fmaxf(m, red[b][w]); // exact in any order
        ms[b] = m;
    }
    __syncthreads();
    for (int b = 0; b < nhb; b++)
        for (int j = tid; j < len; j += MLA_THREADS) sc[b][j] = sl_exp(__fsub_rn(sc[b][j], ms[b]));
    __syncthreads();
    // l on attend_part's 128 threads: each sums its positions in order,
    // then one butterfly a warp and the four warps' tree.
    if (tid < MLA_SUM) {
        for (int b = 0; b < nhb; b++) {
            float l = 0.0f;
            for (int j = tid; j < len; j += MLA_SUM) l = __fadd_rn(l, sc[b][j]);
            l = warp_sum32(l);
            if (lane == 0) red[b][warp] = l;
        }
    }
    __syncthreads();
    for (int b = 0; b < nhb; b++) ls[b] = __fadd_rn(__fadd_rn(red[b][0], red[b][1]), __fadd_rn(red[b][2], red[b][3]));
    if (tid == 0) {
        for (int b = 0; b < nhb; b++) {
            float* pp = part + ((size_t)(i * nh + h0 + b) * nc + c) * (vd + 2);
            pp[vd] = ms[b];
            pp[vd + 1] = ls[b];
        }
    }
    // Values: each dim one chain per head over the chunk's positions in
    // order, each value loaded once for every head.
    for (int d = tid; d < vd; d += MLA_THREADS) {
        float a[MLA_HEADS];
#pragma unroll
        for (int b = 0; b < MLA_HEADS; b++) a[b] = 0.0f;
        int j = 0;
        for (; j + 8 <= len; j += 8) {
            float v[8];
#pragma unroll
            for (int u = 0; u < 8; u++) v[u] = kc[LROW(j + u) + d];
#pragma unroll
            for (int b = 0; b < MLA_HEADS; b++)
                if (b < nhb)
#pragma unroll
                    for (int u = 0; u < 8; u++) a[b] = fmaf(sc[b][j + u], v[u], a[b]);
        }
        for (; j < len; j++) {
            float v = kc[LROW(j) + d];
#pragma unroll
            for (int b = 0; b < MLA_HEADS; b++)
                if (b < nhb) a[b] = fmaf(sc[b][j], v, a[b]);
        }
#pragma unroll
        for (int b = 0; b < MLA_HEADS; b++)
            if (b < nhb) part[((size_t)(i * nh + h0 + b) * nc + c) * (vd + 2) + d] = a[b];
    }
#undef LROW
}

// mla_attend_part is attn.cu's attend_part for a latent cache (one kv
// head, the value the key's first vd dims, no window) with hb heads a
// block: each position's latent is loaded once for the block's heads
// instead of once a head. Per head it does attend_part's operations in
// attend_part's order, so the parts, and the combine's output, are its
// bits. Grid (⌈nh/hb⌉, rows, chunks); qs takes hb·hd floats of dynamic
// shared memory. gate: attend_part's (att_skip).
template <int THREADS>
__device__ __forceinline__ void mla_part(float* __restrict__ part, const float* __restrict__ q,
                                         const float* __restrict__ kc, int pos, int nh, int hb, int hd, int vd, int qRow,
                                         int qHead, float scale, int nc, const int* __restrict__ posp,
                                         const int* __restrict__ sel, int topk, int gate, float* qs,
                                         float (*sc)[MLA_CHUNK], float (*red)[THREADS / 32]) {
    if (posp != nullptr) pos = *posp;
    if (att_skip(gate, pos, gridDim.y, sel != nullptr ? topk : 0, MLA_CHUNK)) return;
    int h0 = blockIdx.x * hb, i = blockIdx.y, c = blockIdx.z;
    int nhb = min(hb, nh - h0); // the heads of this block
    int n = pos + i + 1;
    if (sel != nullptr) n = min(n, topk);
    int j1 = c * MLA_CHUNK;
    if (j1 >= n) return;
    int len = min(j1 + MLA_CHUNK, n) - j1;
    for (int x = threadIdx.x; x < nhb * hd; x += THREADS) {
        int b = x / hd, d = x % hd;
        qs[x] = q[(size_t)i * qRow + (size_t)(h0 + b) * qHead + d];
    }
    __syncthreads();
    if (sel != nullptr)
        mla_chunk<true, THREADS>(part, qs, kc, sel + (size_t)i * topk + j1, len, hd, vd, scale, nhb, h0, i, nh, nc, c, sc,
                                 red);
    else
        mla_chunk<false, THREADS>(part, qs, kc + (size_t)j1 * hd, nullptr, len, hd, vd, scale, nhb, h0, i, nh, nc, c,
                                  sc, red);
}

#define MLA_KERNEL(name, threads)                                                                                      \
    extern "C" __global__ void __launch_bounds__(threads)                                                              \
        name(float* __restrict__ part, const float* __restrict__ q, const float* __restrict__ kc, int pos, int nh,     \
             int hb, int hd, int vd, int qRow, int qHead, float scale, int nc, const int* __restrict__ posp,            \
             const int* __restrict__ sel, int topk, int gate) {                                                        \
        PDL_ENTRY                                                                                                      \
        extern __shared__ float qs[]; /* [hb][hd] */                                                                   \
        __shared__ float sc[MLA_HEADS][MLA_CHUNK];                                                                     \
        __shared__ float red[MLA_HEADS][(threads) / 32];                                                               \
        mla_part<threads>(part, q, kc, pos, nh, hb, hd, vd, qRow, qHead, scale, nc, posp, sel, topk, gate, qs, sc,     \
                          red);                                                                                        \
    }
MLA_KERNEL(mla_attend_part, 128)
MLA_KERNEL(mla_attend_wide, 512)
