// Host stand-ins for the device primitives that gemm.cuh uses, so that
// gemm_emu.cpp can run the kernel on the CPU (TestGemmEmulated). The test
// copies this file beside gemm.cuh as common.cuh.
#pragma once
#include <cstdint>
#include <cstring>
#include <cmath>
#include <algorithm>
#include <barrier>
#include <vector>
#include <functional>
#define __device__
#define __host__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __shared__
#define __align__(x) __attribute__((aligned(x)))
#define PDL_ENTRY // programmatic dependent launch: nothing to wait for on the host
struct dim3e { unsigned x, y, z; };
extern thread_local dim3e threadIdx;
extern dim3e blockIdx;
struct int4 { int x, y, z, w; };
struct uint2 { uint32_t x, y; };
struct float2 { float x, y; };
using std::min; using std::max;
inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
inline float __int2float_rn(int a) { return (float)a; }
struct __half { uint16_t v; };
inline __half __ushort_as_half(unsigned short v) { return {v}; }
inline float __half2float(__half h) {
    uint32_t s = (h.v >> 15) & 1, e = (h.v >> 10) & 31, m = h.v & 1023;
    float f;
    if (e == 0) f = std::ldexp((float)m, -24);
    else if (e == 31) f = m ? NAN : INFINITY;
    else f = std::ldexp((float)(m | 1024), (int)e - 25);
    return s ? -f : f;
}
void __syncthreads();
void mma_s8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1);
void cp_async(void* d, const void* s, int n);
inline void cp_async16(void* d, const void* s) { cp_async(d, s, 16); }
inline void cp_async8(void* d, const void* s) { cp_async(d, s, 8); }
inline void cp_async4(void* d, const void* s) { cp_async(d, s, 4); }
void cp_async_commit();
void cp_async_wait_n(int n);
template <int N> inline void cp_async_wait() { cp_async_wait_n(N); }
