// Fused scale + causal mask + softmax kernels, forward and backward (CUDA C++, no torch header).
//
// Code paths, chosen per launch by row length and alignment:
//  * register: the row lives in registers (fp32). BLOCK_N = next power of two >= cols; each thread
//    holds ITEMS elements as 16-byte vectors; L threads share a row: L <= 32 packs several rows into
//    one warp (short rows), L > 32 is a block per row reducing through shared memory. Needs 16-byte
//    alignment (cols and the row stride multiples of the vector width, aligned base pointers).
//    Forward up to 32768 columns (16-bit types) / 16384 (fp32); backward up to 16384.
//  * smem: a block per row for longer (or unaligned) rows that fit in shared memory (about 227 KB on
//    Hopper): the first pass reads the row from global memory once, keeping the raw values in shared
//    memory, the second pass normalizes from there. Each thread re-reads only what it stored itself.
//  * stream: rows of any length (no cap): the same two passes, the second re-reading global memory
//    backwards, so that the chunks read last in the first pass (still in L2) come first.
// Causal rows load only their unmasked prefix and write zeros after it. Accumulation is fp32; NaN
// propagates within its row; a row with no unmasked key (or all -inf) gives zeros.
// Bytes: forward reads x once (the prefix, when causal) and writes y; backward reads y and dy (prefix)
// and writes dx into a fresh buffer (never into dy).
#include "softmax_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

namespace softmax_harness {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kLongThreads = 512;

template <typename T>
struct Cvt;
template <>
struct Cvt<float> {
  static __device__ __forceinline__ float load(float v) { return v; }
  static __device__ __forceinline__ float store(float v) { return v; }
};
template <>
struct Cvt<__half> {
  static __device__ __forceinline__ float load(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half store(float v) { return __float2half_rn(v); }
};
template <>
struct Cvt<__nv_bfloat16> {
  static __device__ __forceinline__ float load(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 store(float v) { return __float2bfloat16_rn(v); }
};

template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
  T v[VEC];
};

template <int WIDTH>
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = WIDTH / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o, WIDTH));
  return v;
}

template <int WIDTH>
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = WIDTH / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o, WIDTH);
  return v;
}

// Reductions over the L threads of one row. L <= 32: inside a warp (rows never straddle warps).
// L > 32: the whole block is one row; warps combine through shared memory.
template <int L>
__device__ __forceinline__ float row_max(float v, float* red) {
  if constexpr (L <= 32) {
    return warp_max<L>(v);
  } else {
    v = warp_max<32>(v);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < L / 32 ? red[lane] : -INFINITY;
    v = warp_max<32>(v);
    __syncthreads();  // red is reused by the next reduction
    return v;
  }
}

template <int L>
__device__ __forceinline__ float row_sum(float v, float* red) {
  if constexpr (L <= 32) {
    return warp_sum<L>(v);
  } else {
    v = warp_sum<32>(v);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < L / 32 ? red[lane] : 0.f;
    v = warp_sum<32>(v);
    __syncthreads();
    return v;
  }
}

// Number of unmasked keys of a row: all of them, or query i = row mod tq keeps j <= i + diag.
__device__ __forceinline__ int row_limit(int64_t row, int cols, int64_t tq, int64_t diag, bool causal) {
  if (!causal) return cols;
  const int64_t l = row % tq + diag + 1;
  return (int)(l < 0 ? 0 : (l < cols ? l : cols));
}

// ---------------------------------------------------------------------------------------------
// register path
// ---------------------------------------------------------------------------------------------
template <typename T, int VEC, int ITEMS, int L, int ROWS>
__global__ void __launch_bounds__(L* ROWS)
    fwd_register_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int cols,
                        int64_t x_stride, int64_t tq, int64_t diag, float scale_log2e, bool causal) {
  constexpr int NV = ITEMS / VEC;
  __shared__ float red[32];
  const int lane = threadIdx.x % L;
  const int64_t row = (int64_t)blockIdx.x * ROWS + threadIdx.x / L;
  const bool row_ok = row < rows;
  const int lim = row_ok ? row_limit(row, cols, tq, diag, causal) : 0;
  const T* xr = x + (row_ok ? row : 0) * x_stride;

  float v[ITEMS];
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int c0 = (i * L + lane) * VEC;
    if (c0 + VEC <= lim) {
      const Pack<T, VEC> p = *reinterpret_cast<const Pack<T, VEC>*>(xr + c0);
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[i * VEC + j] = Cvt<T>::load(p.v[j]) * scale_log2e;
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const int c = c0 + j;
        v[i * VEC + j] = c < lim ? Cvt<T>::load(xr[c]) * scale_log2e : -INFINITY;
      }
    }
  }
  float m = -INFINITY;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) m = fmaxf(m, v[k]);
  m = row_max<L>(m, red);
  if (m == -INFINITY) m = 0.f;  // no unmasked key: every exp2 below is 0
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    v[k] = exp2f(v[k] - m);
    s += v[k];
  }
  s = row_sum<L>(s, red);
  const float inv = 1.f / (s == 0.f ? 1.f : s);  // NaN stays NaN
  if (!row_ok) return;
  T* yr = y + row * cols;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int c0 = (i * L + lane) * VEC;
    if (c0 >= cols) continue;  // cols is a multiple of VEC on this path
    Pack<T, VEC> p;
#pragma unroll
    for (int j = 0; j < VEC; ++j) p.v[j] = Cvt<T>::store(c0 + j < lim ? v[i * VEC + j] * inv : 0.f);
    *reinterpret_cast<Pack<T, VEC>*>(yr + c0) = p;
  }
}

template <typename T, int VEC, int ITEMS, int L, int ROWS>
__global__ void __launch_bounds__(L* ROWS)
    bwd_register_kernel(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx,
                        int64_t rows, int cols, int64_t dy_stride, int64_t tq, int64_t diag,
                        float scale, bool causal) {
  constexpr int NV = ITEMS / VEC;
  __shared__ float red[32];
  const int lane = threadIdx.x % L;
  const int64_t row = (int64_t)blockIdx.x * ROWS + threadIdx.x / L;
  const bool row_ok = row < rows;
  const int lim = row_ok ? row_limit(row, cols, tq, diag, causal) : 0;
  const T* yr = y + (row_ok ? row : 0) * cols;
  const T* gr = dy + (row_ok ? row : 0) * dy_stride;

  float yv[ITEMS], gv[ITEMS];
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int c0 = (i * L + lane) * VEC;
    if (c0 + VEC <= lim) {
      const Pack<T, VEC> a = *reinterpret_cast<const Pack<T, VEC>*>(yr + c0);
      const Pack<T, VEC> b = *reinterpret_cast<const Pack<T, VEC>*>(gr + c0);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        yv[i * VEC + j] = Cvt<T>::load(a.v[j]);
        gv[i * VEC + j] = Cvt<T>::load(b.v[j]);
      }
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const int c = c0 + j;
        yv[i * VEC + j] = c < lim ? Cvt<T>::load(yr[c]) : 0.f;
        gv[i * VEC + j] = c < lim ? Cvt<T>::load(gr[c]) : 0.f;
      }
    }
  }
  float dot = 0.f;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) dot += yv[k] * gv[k];
  dot = row_sum<L>(dot, red);
  if (!row_ok) return;
  T* xr = dx + row * cols;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int c0 = (i * L + lane) * VEC;
    if (c0 >= cols) continue;
    Pack<T, VEC> p;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const int k = i * VEC + j;
      p.v[j] = Cvt<T>::store(c0 + j < lim ? scale * yv[k] * (gv[k] - dot) : 0.f);
    }
    *reinterpret_cast<Pack<T, VEC>*>(xr + c0) = p;
  }
}

// ---------------------------------------------------------------------------------------------
// smem / stream paths: a block of kLongThreads per row, two passes
// ---------------------------------------------------------------------------------------------
template <typename T, int VEC>
__device__ __forceinline__ Pack<T, VEC> load_prefix(const T* p, int c0, int lim) {
  Pack<T, VEC> out;
  if (c0 + VEC <= lim) {
    out = *reinterpret_cast<const Pack<T, VEC>*>(p + c0);
  } else {
#pragma unroll
    for (int j = 0; j < VEC; ++j) out.v[j] = c0 + j < lim ? p[c0 + j] : Cvt<T>::store(0.f);
  }
  return out;
}

template <typename T, int VEC>
__device__ __forceinline__ void store_row(T* p, int c0, int cols, const Pack<T, VEC>& v) {
  if (c0 + VEC <= cols) {
    *reinterpret_cast<Pack<T, VEC>*>(p + c0) = v;
  } else {
#pragma unroll
    for (int j = 0; j < VEC; ++j)
      if (c0 + j < cols) p[c0 + j] = v.v[j];
  }
}

template <typename T, int VEC, bool CACHE>
__global__ void __launch_bounds__(kLongThreads)
    fwd_long_kernel(const T* __restrict__ x, T* __restrict__ y, int cols, int64_t x_stride,
                    int64_t tq, int64_t diag, float scale_log2e, bool causal) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* cache = reinterpret_cast<T*>(smem);
  __shared__ float red[32];
  constexpr int STEP = kLongThreads * VEC;
  const int64_t row = blockIdx.x;
  const int lim = row_limit(row, cols, tq, diag, causal);
  const T* xr = x + row * x_stride;

  // pass 1: online max and rescaled sum over this thread's chunks
  float m = -INFINITY, s = 0.f;
#pragma unroll 4
  for (int c0 = threadIdx.x * VEC; c0 < lim; c0 += STEP) {
    const Pack<T, VEC> p = load_prefix<T, VEC>(xr, c0, lim);
    if constexpr (CACHE) *reinterpret_cast<Pack<T, VEC>*>(cache + c0) = p;
    float z[VEC];
    float mm = -INFINITY;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      z[j] = c0 + j < lim ? Cvt<T>::load(p.v[j]) * scale_log2e : -INFINITY;
      mm = fmaxf(mm, z[j]);
    }
    const float mn = fmaxf(m, mm);
    const float ref = mn == -INFINITY ? 0.f : mn;
    float add = 0.f;
#pragma unroll
    for (int j = 0; j < VEC; ++j) add += exp2f(z[j] - ref);
    s = s * exp2f(m - ref) + add;
    m = mn;
  }
  float M = row_max<kLongThreads>(m, red);
  if (M == -INFINITY) M = 0.f;
  const float S = row_sum<kLongThreads>(s * exp2f(m - M), red);
  const float inv = 1.f / (S == 0.f ? 1.f : S);

  // pass 2, over this thread's chunks backwards (most recently read first)
  T* yr = y + row * (int64_t)cols;
  const int first = threadIdx.x * VEC;
  if (first >= cols) return;
  for (int k = (cols - 1 - first) / STEP; k >= 0; --k) {
    const int c0 = first + k * STEP;
    const Pack<T, VEC> p = CACHE ? load_prefix<T, VEC>(cache, c0, lim) : load_prefix<T, VEC>(xr, c0, lim);
    Pack<T, VEC> o;
#pragma unroll
    for (int j = 0; j < VEC; ++j)
      o.v[j] = Cvt<T>::store(c0 + j < lim ? exp2f(Cvt<T>::load(p.v[j]) * scale_log2e - M) * inv : 0.f);
    store_row<T, VEC>(yr, c0, cols, o);
  }
}

template <typename T, int VEC, bool CACHE>
__global__ void __launch_bounds__(kLongThreads)
    bwd_long_kernel(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, int cols,
                    int64_t dy_stride, int64_t tq, int64_t diag, float scale, bool causal,
                    int dy_cache_offset) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* cache_y = reinterpret_cast<T*>(smem);
  T* cache_g = reinterpret_cast<T*>(smem + dy_cache_offset);
  __shared__ float red[32];
  constexpr int STEP = kLongThreads * VEC;
  const int64_t row = blockIdx.x;
  const int lim = row_limit(row, cols, tq, diag, causal);
  const T* yr = y + row * (int64_t)cols;
  const T* gr = dy + row * dy_stride;

  float acc = 0.f;
#pragma unroll 4
  for (int c0 = threadIdx.x * VEC; c0 < lim; c0 += STEP) {
    const Pack<T, VEC> a = load_prefix<T, VEC>(yr, c0, lim);
    const Pack<T, VEC> b = load_prefix<T, VEC>(gr, c0, lim);
    if constexpr (CACHE) {
      *reinterpret_cast<Pack<T, VEC>*>(cache_y + c0) = a;
      *reinterpret_cast<Pack<T, VEC>*>(cache_g + c0) = b;
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc += Cvt<T>::load(a.v[j]) * Cvt<T>::load(b.v[j]);
  }
  const float dot = row_sum<kLongThreads>(acc, red);

  T* xr = dx + row * (int64_t)cols;
  const int first = threadIdx.x * VEC;
  if (first >= cols) return;
  for (int k = (cols - 1 - first) / STEP; k >= 0; --k) {
    const int c0 = first + k * STEP;
    const Pack<T, VEC> a = CACHE ? load_prefix<T, VEC>(cache_y, c0, lim) : load_prefix<T, VEC>(yr, c0, lim);
    const Pack<T, VEC> b = CACHE ? load_prefix<T, VEC>(cache_g, c0, lim) : load_prefix<T, VEC>(gr, c0, lim);
    Pack<T, VEC> o;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float yy = Cvt<T>::load(a.v[j]);
      o.v[j] = Cvt<T>::store(c0 + j < lim ? scale * yy * (Cvt<T>::load(b.v[j]) - dot) : 0.f);
    }
    store_row<T, VEC>(xr, c0, cols, o);
  }
}

// ---------------------------------------------------------------------------------------------
// host side: configuration and dispatch
// ---------------------------------------------------------------------------------------------
template <typename T>
constexpr int vec_of() {
  return 16 / (int)sizeof(T);
}
template <typename T>
constexpr int reg_max_fwd() {
  return sizeof(T) == 2 ? 32768 : 16384;
}
constexpr int kRegMaxBwd = 16384;

template <typename T, int BLOCK_N>
struct RegCfg {
  static constexpr int VEC = vec_of<T>();
  static constexpr int ITEMS = BLOCK_N / 32 < VEC ? VEC : (BLOCK_N / 32 > 32 ? 32 : BLOCK_N / 32);
  static constexpr int L = BLOCK_N / ITEMS;  // threads per row
  static constexpr int ROWS = L >= 32 ? (L == 32 ? 8 : 1) : 256 / L;  // rows per block
  static_assert(ITEMS % VEC == 0 && L * ITEMS == BLOCK_N && L * ROWS <= 1024, "bad register config");
};

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

inline int max_optin_smem() {
  int dev = 0, v = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 48 * 1024;
  if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) return 48 * 1024;
  return v - 1024;  // leave room for the static reduction buffer
}

inline size_t round16(size_t n) { return (n + 15) & ~size_t(15); }

inline int next_pow2_at_least(int64_t n, int lo) {
  int b = lo;
  while (b < n) b <<= 1;
  return b;
}

struct Args {
  const void* a;  // x (forward) or y (backward)
  const void* b;  // dy (backward)
  void* out;
  int64_t rows, cols, stride, tq, diag;
  float scale;
  bool causal;
  cudaStream_t stream;
};

template <typename T, int BLOCK_N>
cudaError_t launch_fwd_register(const Args& a) {
  using C = RegCfg<T, BLOCK_N>;
  const int64_t blocks = (a.rows + C::ROWS - 1) / C::ROWS;
  fwd_register_kernel<T, C::VEC, C::ITEMS, C::L, C::ROWS><<<(unsigned)blocks, C::L * C::ROWS, 0, a.stream>>>(
      static_cast<const T*>(a.a), static_cast<T*>(a.out), a.rows, (int)a.cols, a.stride, a.tq, a.diag,
      a.scale * kLog2e, a.causal);
  return cudaGetLastError();
}

template <typename T, int BLOCK_N>
cudaError_t launch_bwd_register(const Args& a) {
  using C = RegCfg<T, BLOCK_N>;
  const int64_t blocks = (a.rows + C::ROWS - 1) / C::ROWS;
  bwd_register_kernel<T, C::VEC, C::ITEMS, C::L, C::ROWS><<<(unsigned)blocks, C::L * C::ROWS, 0, a.stream>>>(
      static_cast<const T*>(a.a), static_cast<const T*>(a.b), static_cast<T*>(a.out), a.rows, (int)a.cols,
      a.stride, a.tq, a.diag, a.scale, a.causal);
  return cudaGetLastError();
}

template <typename Kernel>
cudaError_t allow_smem(Kernel kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

template <typename T, int VEC, bool CACHE>
cudaError_t launch_fwd_long(const Args& a) {
  const size_t bytes = CACHE ? round16((size_t)a.cols * sizeof(T)) : 0;
  auto kernel = fwd_long_kernel<T, VEC, CACHE>;
  cudaError_t err = allow_smem(kernel, bytes);
  if (err != cudaSuccess) return err;
  kernel<<<(unsigned)a.rows, kLongThreads, bytes, a.stream>>>(
      static_cast<const T*>(a.a), static_cast<T*>(a.out), (int)a.cols, a.stride, a.tq, a.diag,
      a.scale * kLog2e, a.causal);
  return cudaGetLastError();
}

template <typename T, int VEC, bool CACHE>
cudaError_t launch_bwd_long(const Args& a) {
  const size_t half = round16((size_t)a.cols * sizeof(T));
  const size_t bytes = CACHE ? 2 * half : 0;
  auto kernel = bwd_long_kernel<T, VEC, CACHE>;
  cudaError_t err = allow_smem(kernel, bytes);
  if (err != cudaSuccess) return err;
  kernel<<<(unsigned)a.rows, kLongThreads, bytes, a.stream>>>(
      static_cast<const T*>(a.a), static_cast<const T*>(a.b), static_cast<T*>(a.out), (int)a.cols,
      a.stride, a.tq, a.diag, a.scale, a.causal, CACHE ? (int)half : 0);
  return cudaGetLastError();
}

#define REG_CASE(BN, LAUNCH, MAX)                                       \
  case BN:                                                              \
    if constexpr (BN >= vec_of<T>() && BN <= (MAX)) return LAUNCH<T, BN>(a); \
    break;

template <typename T>
bool is_aligned(const Args& a, bool backward) {
  constexpr int VEC = vec_of<T>();
  bool ok = a.cols % VEC == 0 && a.stride % VEC == 0 && aligned16(a.a) && aligned16(a.out);
  if (backward) ok = ok && aligned16(a.b);
  return ok;
}

template <typename T>
cudaError_t fwd_dispatch(const Args& a) {
  constexpr int VEC = vec_of<T>();
  const bool aligned = is_aligned<T>(a, false);
  if (aligned && a.cols <= reg_max_fwd<T>()) {
    switch (next_pow2_at_least(a.cols, VEC)) {
      REG_CASE(4, launch_fwd_register, reg_max_fwd<T>())
      REG_CASE(8, launch_fwd_register, reg_max_fwd<T>())
      REG_CASE(16, launch_fwd_register, reg_max_fwd<T>())
      REG_CASE(32, launch_fwd_register, reg_max_fwd<T>())
      REG_CASE(64, launch_fwd_register, reg_max_fwd<T>())
      REG_CASE(128, launch_fwd_register, reg_max_fwd<T>())
      REG_CASE(256, launch_fwd_register, reg_max_fwd<T>())
      REG_CASE(512, launch_fwd_register, reg_max_fwd<T>())
      REG_CASE(1024, launch_fwd_register, reg_max_fwd<T>())
      REG_CASE(2048, launch_fwd_register, reg_max_fwd<T>())
      REG_CASE(4096, launch_fwd_register, reg_max_fwd<T>())
      REG_CASE(8192, launch_fwd_register, reg_max_fwd<T>())
      REG_CASE(16384, launch_fwd_register, reg_max_fwd<T>())
      REG_CASE(32768, launch_fwd_register, reg_max_fwd<T>())
      default:
        break;
    }
  }
  const bool cache = round16((size_t)a.cols * sizeof(T)) <= (size_t)max_optin_smem();
  if (aligned) return cache ? launch_fwd_long<T, VEC, true>(a) : launch_fwd_long<T, VEC, false>(a);
  return cache ? launch_fwd_long<T, 1, true>(a) : launch_fwd_long<T, 1, false>(a);
}

template <typename T>
cudaError_t bwd_dispatch(const Args& a) {
  constexpr int VEC = vec_of<T>();
  const bool aligned = is_aligned<T>(a, true);
  if (aligned && a.cols <= kRegMaxBwd) {
    switch (next_pow2_at_least(a.cols, VEC)) {
      REG_CASE(4, launch_bwd_register, kRegMaxBwd)
      REG_CASE(8, launch_bwd_register, kRegMaxBwd)
      REG_CASE(16, launch_bwd_register, kRegMaxBwd)
      REG_CASE(32, launch_bwd_register, kRegMaxBwd)
      REG_CASE(64, launch_bwd_register, kRegMaxBwd)
      REG_CASE(128, launch_bwd_register, kRegMaxBwd)
      REG_CASE(256, launch_bwd_register, kRegMaxBwd)
      REG_CASE(512, launch_bwd_register, kRegMaxBwd)
      REG_CASE(1024, launch_bwd_register, kRegMaxBwd)
      REG_CASE(2048, launch_bwd_register, kRegMaxBwd)
      REG_CASE(4096, launch_bwd_register, kRegMaxBwd)
      REG_CASE(8192, launch_bwd_register, kRegMaxBwd)
      REG_CASE(16384, launch_bwd_register, kRegMaxBwd)
      default:
        break;
    }
  }
  const bool cache = 2 * round16((size_t)a.cols * sizeof(T)) <= (size_t)max_optin_smem();
  if (aligned) return cache ? launch_bwd_long<T, VEC, true>(a) : launch_bwd_long<T, VEC, false>(a);
  return cache ? launch_bwd_long<T, 1, true>(a) : launch_bwd_long<T, 1, false>(a);
}

#undef REG_CASE

}  // namespace

cudaError_t softmax_fwd(DType dtype, const void* x, void* y, int64_t rows, int64_t cols,
                        int64_t x_row_stride, int64_t tq, int64_t diag, float scale, bool causal,
                        cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  if (cols > 0x7fffffff || rows > 0x7fffffff) return cudaErrorInvalidValue;
  const Args a{x, nullptr, y, rows, cols, x_row_stride, tq < 1 ? 1 : tq, diag, scale, causal, stream};
  switch (dtype) {
    case DType::F32:
      return fwd_dispatch<float>(a);
    case DType::F16:
      return fwd_dispatch<__half>(a);
    case DType::BF16:
      return fwd_dispatch<__nv_bfloat16>(a);
  }
  return cudaErrorInvalidValue;
}

cudaError_t softmax_bwd(DType dtype, const void* y, const void* dy, void* dx, int64_t rows,
                        int64_t cols, int64_t dy_row_stride, int64_t tq, int64_t diag, float scale,
                        bool causal, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  if (cols > 0x7fffffff || rows > 0x7fffffff) return cudaErrorInvalidValue;
  const Args a{y, dy, dx, rows, cols, dy_row_stride, tq < 1 ? 1 : tq, diag, scale, causal, stream};
  switch (dtype) {
    case DType::F32:
      return bwd_dispatch<float>(a);
    case DType::F16:
      return bwd_dispatch<__half>(a);
    case DType::BF16:
      return bwd_dispatch<__nv_bfloat16>(a);
  }
  return cudaErrorInvalidValue;
}

const char* softmax_path(DType dtype, bool backward, int64_t cols, bool aligned) {
  const int elem = dtype == DType::F32 ? 4 : 2;
  const int64_t reg_max = backward ? kRegMaxBwd : (elem == 2 ? 32768 : 16384);
  if (aligned && cols <= reg_max) return "register";
  const size_t bytes = (backward ? 2 : 1) * round16((size_t)cols * elem);
  return bytes <= (size_t)max_optin_smem() ? "smem" : "stream";
}

}  // namespace softmax_harness
