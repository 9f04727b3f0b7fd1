// Glue of the forward pass on the GPU: float32 products (router, DeltaNet
// b and a, the shared expert's gate), the gather of expert inputs and the
// combine of the routed outputs in router order. Each output element is
// computed by one thread or one warp in a fixed order, so a row's bits
// never depend on the batch.
#include "common.cuh"

// f32_dot is one warp's W row · x row over C floats: lane l sums columns
// l, l+32, ... with fmaf, then lanes32_sum. Every lane returns it.
__device__ __forceinline__ float f32_dot(const float* __restrict__ w, const float* __restrict__ xr, int C) {
    int lane = threadIdx.x & 31;
    float a = 0.0f;
    int i = lane;
    for (; i + 7 * 32 < C; i += 8 * 32) { // eight loads of each in flight, then the chain in order
        float wv[8], xv[8];
#pragma unroll
        for (int u = 0; u < 8; u++) wv[u] = w[i + 32 * u], xv[u] = xr[i + 32 * u];
#pragma unroll
        for (int u = 0; u < 8; u++) a = fmaf(wv[u], xv[u], a);
    }
    for (; i < C; i += 32) a = fmaf(w[i], xr[i], a);
    return lanes32_sum(a);
}

// f32_mv: out[r][o] = Σ_c W[o][c]·x[r][c] for nb rows of x; one warp per
// (o, r) (f32_dot).
extern "C" __global__ void f32_mv(const float* __restrict__ W, const float* __restrict__ x, float* __restrict__ out,
                                  int O, int C, int nb) {
    PDL_ENTRY
    int o = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int r = blockIdx.y;
    if (o >= O || r >= nb) return;
    float a = f32_dot(W + (size_t)o * C, x + (size_t)r * C, C);
    if ((threadIdx.x & 31) == 0) out[(size_t)r * O + o] = a;
}

// head_f32 is f32_mv a head at a time (DeepSeek's W_k and W_v in float32):
// out row (i, h) = W_h·x row (i, h), where W is [heads·O][C] with head h's
// O rows from row h·O, x row (i, h) is at x + i·xRow + h·xHead and out row
// (i, h) at out + i·oRow + h·oHead. Grid (⌈O/8⌉, heads, rows).
extern "C" __global__ void head_f32(const float* __restrict__ W, const float* __restrict__ x, float* __restrict__ out,
                                    int O, int C, int xRow, int xHead, int oRow, int oHead) {
    PDL_ENTRY
    int o = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int h = blockIdx.y, i = blockIdx.z;
    if (o >= O) return;
    float a = f32_dot(W + ((size_t)h * O + o) * C, x + (size_t)i * xRow + (size_t)h * xHead, C);
    if ((threadIdx.x & 31) == 0) out[(size_t)i * oRow + (size_t)h * oHead + o] = a;
}

// copy_rows: dst row r = src row r, n floats each, rows rows; the rows are
// ds and ss floats apart.
extern "C" __global__ void copy_rows(float* __restrict__ dst, int ds, const float* __restrict__ src, int ss, int rows,
                                     int n) {
    PDL_ENTRY
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (size_t)rows * n) return;
    size_t r = t / n, c = t % n;
    dst[r * ds + c] = src[r * ss + c];
}

// gather_rows: dst[j] = src[idx[j]] for n rows of width floats.
extern "C" __global__ void gather_rows(float* __restrict__ dst, const float* __restrict__ src, const int* __restrict__ idx,
                                       int n, int width) {
    PDL_ENTRY
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (size_t)n * width) return;
    size_t j = t / width, c = t % width;
    dst[t] = src[(size_t)idx[j] * width + c];
}

// moe_combine: y[i] = Σ_k w[i][k]·outk[pos[i][k]] in router order, then
// plus g·shared[i] when mode > 0 (mode 1: g = 1; mode 2: g =
// sigmoid(sgate[i])). As the CPU's combine: clear, Axpy per expert.
extern "C" __global__ void moe_combine(float* __restrict__ y, const float* __restrict__ outk, const int* __restrict__ pos,
                                       const float* __restrict__ w, const float* __restrict__ shared,
                                       const float* __restrict__ sgate, int nb, int K, int H, int mode) {
    PDL_ENTRY
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (size_t)nb * H) return;
    int i = (int)(t / H), c = (int)(t % H);
    float a = 0.0f;
    for (int k = 0; k < K; k++) a = __fadd_rn(a, __fmul_rn(w[i * K + k], outk[(size_t)pos[i * K + k] * H + c]));
    if (mode > 0) {
        float g = 1.0f;
        if (mode == 2) g = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-sgate[i])));
        a = __fadd_rn(a, __fmul_rn(g, shared[(size_t)i * H + c]));
    }
    y[t] = a;
}

// kv_append: one row's keys and values (n floats each) into the cache row
// of position *posp (*posp % ring in a ring of ring rows, ring > 0), the
// position read on the device so that a recorded decode step replays at
// any position. vc may be null: a latent cache has one row per position.
extern "C" __global__ void kv_append(float* __restrict__ kc, float* __restrict__ vc, const float* __restrict__ k,
                                     const float* __restrict__ v, const int* __restrict__ posp, int n, int ring) {
    PDL_ENTRY
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    int p = *posp;
    size_t off = (size_t)(ring > 0 ? p % ring : p) * n + t;
    kc[off] = k[t];
    if (vc != nullptr) vc[off] = v[t];
}
