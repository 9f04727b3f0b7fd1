// gemm_emu runs matvec.cu's tiled q4 kernel (gemm.cuh) on the CPU and
// checks every output bit for bit against q4_rows' arithmetic, written out
// here: the plain, grouped and head-at-a-time modes, tiles of 32 and 64
// rows, with cp.async copies landing when issued and when waited for (the
// two ends of what the hardware may do). A block's 256 threads are 256
// host threads; __syncthreads is a barrier; mma m16n8k32 is computed from
// the fragments the warp's 32 lanes hand in, as the PTX ISA lays them
// out. q4_mma (matvec.cu, whose bits the GPU tests check on the device)
// runs through the same emulated mma first, which checks the emulation.
// Exit status 0 when everything matches. TestGemmEmulated builds and runs
// it.
#include "common.cuh"
#include "gemm.cuh"
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <random>
#include <thread>

template <class T> T __ldg(const T* p) { return *p; }
inline float ld_half(const uint16_t* p) { return __half2float(__ushort_as_half(*p)); }
#include "q4_mma.inc"

thread_local dim3e threadIdx;
dim3e blockIdx;
alignas(16) uint8_t gemm_smem[1 << 17];

// The block: nthreads workers that run body for each block in turn.
static int nthreads;
static std::barrier<>* blockBar;
struct WarpX {
    uint32_t a[32][4], b[32][2];
    std::barrier<> bar{32};
};
static WarpX warpx[8];
static bool lateCopies;
struct Copy {
    void* d;
    const void* s;
    int n;
};
thread_local std::deque<std::vector<Copy>> groups;
thread_local std::vector<Copy> pending;

void __syncthreads() { blockBar->arrive_and_wait(); }
void cp_async(void* d, const void* s, int n) {
    if (((uintptr_t)d % n) || ((uintptr_t)s % n)) {
        fprintf(stderr, "misaligned cp.async of %d bytes\n", n);
        abort();
    }
    if ((uint8_t*)d < gemm_smem || (uint8_t*)d + n > gemm_smem + sizeof gemm_smem) {
        fprintf(stderr, "cp.async outside shared memory\n");
        abort();
    }
    if (lateCopies) pending.push_back({d, s, n});
    else memcpy(d, s, n);
}
void cp_async_commit() {
    groups.push_back(pending);
    pending.clear();
}
void cp_async_wait_n(int n) {
    while ((int)groups.size() > n) {
        for (auto& c : groups.front()) memcpy(c.d, c.s, c.n);
        groups.pop_front();
    }
}
static int8_t byte(uint32_t w, int i) { return (int8_t)((w >> (8 * i)) & 0xff); }
void mma_s8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    int lane = threadIdx.x & 31;
    WarpX& X = warpx[threadIdx.x >> 5];
    X.a[lane][0] = a0, X.a[lane][1] = a1, X.a[lane][2] = a2, X.a[lane][3] = a3;
    X.b[lane][0] = b0, X.b[lane][1] = b1;
    X.bar.arrive_and_wait();
    // A[m][k], 16x32, and B[k][n], 32x8, from the lanes' fragments.
    int A[16][32], B[32][8];
    for (int L = 0; L < 32; L++) {
        int g = L >> 2, t = L & 3;
        for (int i = 0; i < 4; i++) {
            A[g][4 * t + i] = byte(X.a[L][0], i);
            A[g + 8][4 * t + i] = byte(X.a[L][1], i);
            A[g][16 + 4 * t + i] = byte(X.a[L][2], i);
            A[g + 8][16 + 4 * t + i] = byte(X.a[L][3], i);
            B[4 * t + i][g] = byte(X.b[L][0], i);
            B[16 + 4 * t + i][g] = byte(X.b[L][1], i);
        }
    }
    X.bar.arrive_and_wait();
    int gid = lane >> 2, t = lane & 3;
    for (int c = 0; c < 4; c++) {
        int m = gid + 8 * (c >> 1), n = 2 * t + (c & 1), s = 0;
        for (int k = 0; k < 32; k++) s += A[m][k] * B[k][n];
        d[c] += s;
    }
}

// launch runs a grid of gx x gy blocks of threads threads, one block at a
// time, on a pool of host threads started for the launch.
static void launch(int gx, int gy, int threads, const std::function<void()>& body) {
    nthreads = threads;
    std::barrier<> bar(threads), gate(threads + 1);
    blockBar = &bar;
    bool done = false;
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; t++)
        pool.emplace_back([&, t] {
            threadIdx = {(unsigned)t, 0, 0};
            for (;;) {
                gate.arrive_and_wait(); // a block is set up, or the launch is over
                if (done) return;
                groups.clear();
                pending.clear();
                body();
                cp_async_wait_n(0);
                gate.arrive_and_wait(); // the block is finished
            }
        });
    for (int by = 0; by < gy; by++)
        for (int bx = 0; bx < gx; bx++) {
            blockIdx = {(unsigned)bx, (unsigned)by, 0};
            memset(gemm_smem, 0xa5, sizeof gemm_smem); // stale data shows
            gate.arrive_and_wait();
            gate.arrive_and_wait();
        }
    done = true;
    gate.arrive_and_wait();
    for (auto& th : pool) th.join();
}

static uint16_t rhalf(std::mt19937& r) { // a normal half of modest size, either sign
    std::uniform_int_distribution<int> e(10, 17), m(0, 1023), s(0, 1);
    return (uint16_t)(s(r) << 15 | e(r) << 10 | m(r));
}
struct Mat {
    int O, C;
    std::vector<uint8_t> q;
    std::vector<uint16_t> sc, bi;
};
static Mat rmat(std::mt19937& r, int O, int C) {
    Mat m{O, C};
    m.q.resize((size_t)O * C / 2), m.sc.resize((size_t)O * C / 64), m.bi.resize((size_t)O * C / 64);
    for (auto& v : m.q) v = r() & 0xff;
    for (auto& v : m.sc) v = rhalf(r);
    for (auto& v : m.bi) v = rhalf(r);
    return m;
}
struct Acts {
    int N, C;
    std::vector<int8_t> x8;
    std::vector<float> xs, xsum;
};
static Acts racts(std::mt19937& r, int N, int C) {
    Acts a{N, C};
    a.x8.resize((size_t)N * C), a.xs.resize((size_t)N * C / 64), a.xsum.resize((size_t)N * C / 64);
    std::uniform_int_distribution<int> q(-127, 127);
    std::uniform_real_distribution<float> f(-3, 3);
    for (auto& v : a.x8) v = q(r);
    for (auto& v : a.xs) v = std::fabs(f(r)) / 127;
    for (auto& v : a.xsum) v = f(r) * 8;
    return a;
}
// ref is q4_rows' product of row o of m with activation row j: per group
// the exact integer sum, then acc + (float(s)·(scale·xs) + bias·xsum),
// each operation rounded, groups in order.
static float ref(const Mat& m, int o, const Acts& a, int j) {
    int ng = m.C / 64;
    float acc = 0;
    for (int g = 0; g < ng; g++) {
        int s = 0;
        for (int k = 0; k < 32; k++) {
            uint8_t b = m.q[(size_t)o * m.C / 2 + g * 32 + k];
            s += (b & 15) * a.x8[(size_t)j * m.C + g * 64 + k] + (b >> 4) * a.x8[(size_t)j * m.C + g * 64 + 32 + k];
        }
        float c = __fmul_rn(__half2float(__ushort_as_half(m.sc[(size_t)o * ng + g])), a.xs[(size_t)j * ng + g]);
        float t = __fmul_rn(__int2float_rn(s), c);
        float b = __fmul_rn(__half2float(__ushort_as_half(m.bi[(size_t)o * ng + g])), a.xsum[(size_t)j * ng + g]);
        acc = __fadd_rn(acc, __fadd_rn(t, b));
    }
    return acc;
}
static int fails;
static void check(const char* what, const std::vector<float>& got, const std::vector<float>& want) {
    int bad = 0;
    for (size_t i = 0; i < want.size(); i++)
        if (memcmp(&got[i], &want[i], 4)) {
            if (bad < 3) fprintf(stderr, "%s: [%zu] = %g, want %g\n", what, i, got[i], want[i]);
            bad++;
        }
    printf("%s %s (%d of %zu differ)\n", bad ? "FAIL" : "ok  ", what, bad, want.size());
    fails += bad > 0;
}
template <int BN>
static void gemm(const unsigned long long* tab, const int4* tiles, const Mat* m, const Acts& a, float* out, int O,
                 int nb, int heads, int gx) {
    launch(gx, (O + GEMM_M - 1) / GEMM_M, GEMM_THREADS, [&] {
        q4_gemm<BN>(tab, tiles, m ? m->q.data() : nullptr, m ? m->sc.data() : nullptr, m ? m->bi.data() : nullptr,
                    a.x8.data(), a.xs.data(), a.xsum.data(), out, O, a.C, nb, heads);
    });
}
static void both(const char* what, int nb, int heads, int ntiles, const unsigned long long* tab, const int4* tiles,
                 const Mat* m, const Acts& a, int O, const std::vector<float>& want) {
    for (int bn : {32, 64}) {
        std::vector<float> out(want.size(), NAN);
        int gx = ntiles ? ntiles : (heads ? heads : 1) * ((nb + bn - 1) / bn);
        if (bn == 32) gemm<32>(tab, tiles, m, a, out.data(), O, nb, heads, gx);
        else gemm<64>(tab, tiles, m, a, out.data(), O, nb, heads, gx);
        char name[160];
        snprintf(name, sizeof name, "%s, tiles of %d, copies landing %s", what, bn, lateCopies ? "at the wait" : "at issue");
        check(name, out, want);
    }
}

int main() {
    std::mt19937 r(7);
    {
        int O = 200, C = 384, N = 21;
        Mat m = rmat(r, O, C);
        Acts a = racts(r, N, C);
        std::vector<float> want((size_t)N * O), out(want.size(), NAN);
        for (int j = 0; j < N; j++)
            for (int o = 0; o < O; o++) want[(size_t)j * O + o] = ref(m, o, a, j);
        launch((O + 63) / 64, (N + 7) / 8, 128, [&] {
            q4_mma(m.q.data(), m.sc.data(), m.bi.data(), a.x8.data(), a.xs.data(), a.xsum.data(), out.data(), O, C, N);
        });
        check("q4_mma through the emulated mma", out, want);
    }
    for (int late = 0; late < 2; late++) {
        lateCopies = late;
        int shapes[][3] = {{300, 256, 100}, {129, 1024, 40}, {64, 2048, 65}, {130, 384, 5}};
        for (auto& sh : shapes) {
            int O = sh[0], C = sh[1], N = sh[2];
            Mat m = rmat(r, O, C);
            Acts a = racts(r, N, C);
            std::vector<float> want((size_t)N * O);
            for (int j = 0; j < N; j++)
                for (int o = 0; o < O; o++) want[(size_t)j * O + o] = ref(m, o, a, j);
            char what[64];
            snprintf(what, sizeof what, "plain [%d %d] x %d rows", O, C, N);
            both(what, N, 0, 0, nullptr, nullptr, &m, a, O, want);
        }
        {
            // Grouped: 4 matrices; rows 0..39 matrix 2 (tiles of 32 and 8),
            // 40..44 matrix 0, every third row of 45..89 matrix 3, the
            // others of 45..89 matrix 1.
            const int nm = 4, O = 160, C = 384, N = 90;
            std::vector<Mat> ms;
            std::vector<unsigned long long> tab;
            for (int i = 0; i < nm; i++) ms.push_back(rmat(r, O, C));
            for (auto& m : ms) {
                tab.push_back((unsigned long long)m.q.data());
                tab.push_back((unsigned long long)m.sc.data());
                tab.push_back((unsigned long long)m.bi.data());
            }
            Acts a = racts(r, N, C);
            std::vector<int> which(N, -1);
            std::vector<int4> tiles;
            auto add = [&](int mi, int first, int rows, int step) {
                for (int j = 0; j < rows; j += 32) {
                    int n = std::min(32, rows - j);
                    tiles.push_back({mi, first + j * step, n, step});
                    for (int k = 0; k < n; k++) which[first + (j + k) * step] = mi;
                }
            };
            add(2, 0, 40, 1), add(0, 40, 5, 1), add(3, 45, 15, 3), add(1, 46, 15, 3), add(1, 47, 15, 3);
            std::vector<float> want((size_t)N * O);
            for (int j = 0; j < N; j++)
                for (int o = 0; o < O; o++) want[(size_t)j * O + o] = ref(ms[which[j]], o, a, j);
            both("grouped", N, 0, (int)tiles.size(), tab.data(), tiles.data(), nullptr, a, O, want);
        }
        {
            // A head at a time: head h is rows h·O.. of one matrix.
            const int nb = 70, heads = 3, O = 200, C = 256;
            Mat m = rmat(r, heads * O, C);
            std::vector<unsigned long long> tab;
            for (int h = 0; h < heads; h++) {
                tab.push_back((unsigned long long)(m.q.data() + (size_t)h * O * C / 2));
                tab.push_back((unsigned long long)(m.sc.data() + (size_t)h * O * C / 64));
                tab.push_back((unsigned long long)(m.bi.data() + (size_t)h * O * C / 64));
            }
            Acts a = racts(r, nb * heads, C);
            std::vector<float> want((size_t)nb * heads * O);
            for (int k = 0; k < nb * heads; k++)
                for (int o = 0; o < O; o++) want[(size_t)k * O + o] = ref(m, (k % heads) * O + o, a, k);
            both("heads", nb, heads, 0, tab.data(), nullptr, nullptr, a, O, want);
        }
    }
    printf("%d failures\n", fails);
    return fails != 0;
}
