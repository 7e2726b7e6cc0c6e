// Fused scale + causal mask + softmax kernels, forward and backward (CUDA C++, no torch header).
//
// Code paths, chosen per launch by row length and alignment:
//  * register: the row stays in registers (fp32, loaded with 16-byte vectors). BLOCK_N is the next
//    power of two >= cols; L threads share a row, ITEMS elements each: L <= 32 packs several rows into
//    one warp (short rows), L > 32 is a block per row. One pass over memory each way, one exponential
//    per element: each thread exponentiates against its own max, then one merged (max, sum) reduction
//    (online-softmax merge) rescales by exp2(thread max - row max).
//  * cluster: long rows are split over a thread-block cluster (Hopper, up to 16 CTAs); each CTA keeps
//    its slice in registers and the CTAs combine their (max, sum) partials through distributed shared
//    memory. Still one pass over memory each way, with many CTAs in flight per SM.
//  * stream: rows of any length (no cap) and unaligned rows: a block per row, two passes over global
//    memory, the second walking backwards so the chunks read last (still in L2) come first.
// Register and cluster paths need 16-byte alignment (cols and the row stride multiples of the vector
// width, aligned base pointers). Causal rows load only their unmasked prefix and write zeros after it.
// Math in fp32 with exp2 and one fma per element (exp2(x * c - m) never rounds x * c first); NaN
// propagates within its row; a row with no unmasked key (or all -inf) gives zeros.
// Bytes: forward reads x once (its prefix, when causal) and writes y; backward reads y and dy (prefix)
// and writes dx into a fresh buffer (never into dy).
#include "softmax_kernels.h"

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

namespace softmax_harness {
namespace {

namespace cg = cooperative_groups;

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kStreamThreads = 512;

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

// 2^x with the SFU instruction (relative error ~2^-22, what Triton's tl.exp2 uses as well).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// ---------------------------------------------------------------------------------------------
// reductions
// ---------------------------------------------------------------------------------------------
// Merge two (max, sum) partials of an online softmax (sums relative to their max, exp2 domain).
// -inf maxima (nothing unmasked yet) merge without NaN; a NaN sum stays NaN.
__device__ __forceinline__ void merge_stats(float& m, float& s, float mo, float so) {
  const float mn = fmaxf(m, mo);
  const float ref = mn == -INFINITY ? 0.f : mn;
  s = s * fast_exp2(m - ref) + so * fast_exp2(mo - ref);
  m = mn;
}

// (max, sum) over the L threads of one row; every thread gets the result. L <= 32: inside a warp
// (rows never straddle warps); L > 32: the block is one row, warps combine through shared memory.
template <int L>
__device__ __forceinline__ void row_stats(float& m, float& s, float2* red) {
  constexpr int W = L < 32 ? L : 32;
#pragma unroll
  for (int o = W / 2; o > 0; o >>= 1) {
    const float mo = __shfl_xor_sync(0xffffffffu, m, o, W);
    const float so = __shfl_xor_sync(0xffffffffu, s, o, W);
    merge_stats(m, s, mo, so);
  }
  if constexpr (L > 32) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) red[warp] = make_float2(m, s);
    __syncthreads();
    const float2 v = lane < L / 32 ? red[lane] : make_float2(-INFINITY, 0.f);
    m = v.x;
    s = v.y;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float mo = __shfl_xor_sync(0xffffffffu, m, o);
      const float so = __shfl_xor_sync(0xffffffffu, s, o);
      merge_stats(m, s, mo, so);
    }
    __syncthreads();  // red is reused
  }
}

template <int L>
__device__ __forceinline__ float row_sum(float v, float2* red) {
  constexpr int W = L < 32 ? L : 32;
#pragma unroll
  for (int o = W / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o, W);
  if constexpr (L > 32) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) red[warp] = make_float2(v, 0.f);
    __syncthreads();
    v = lane < L / 32 ? red[lane].x : 0.f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
  }
  return v;
}

// Combine the per-CTA partials of one row across its cluster (distributed shared memory).
__device__ __forceinline__ void cluster_stats(float& m, float& s, float2* slot) {
  cg::cluster_group cluster = cg::this_cluster();
  if (threadIdx.x == 0) *slot = make_float2(m, s);
  cluster.sync();
  float cm = -INFINITY, cs = 0.f;
  const unsigned n = cluster.num_blocks();
  for (unsigned r = 0; r < n; ++r) {
    const float2 o = *cluster.map_shared_rank(slot, r);
    merge_stats(cm, cs, o.x, o.y);
  }
  cluster.sync();  // no CTA leaves (freeing its slot) while others still read it
  m = cm;
  s = cs;
}

__device__ __forceinline__ float cluster_sum(float v, float2* slot) {
  cg::cluster_group cluster = cg::this_cluster();
  if (threadIdx.x == 0) *slot = make_float2(v, 0.f);
  cluster.sync();
  float total = 0.f;
  const unsigned n = cluster.num_blocks();
  for (unsigned r = 0; r < n; ++r) total += cluster.map_shared_rank(slot, r)->x;
  cluster.sync();
  return total;
}

template <int NT>
__device__ __forceinline__ void block_stats(float& m, float& s, float2* red) {
  row_stats<NT>(m, s, red);
}

// ---------------------------------------------------------------------------------------------
// indexing helpers
// ---------------------------------------------------------------------------------------------
// Number of unmasked keys of a row: all of them, or query i = row mod tq keeps j <= i + diag.
// rows, tq < 2^31 (checked on the host): 32-bit modulo, no 64-bit division routine.
__device__ __forceinline__ int row_limit(int64_t row, int cols, int64_t tq, int64_t diag, bool causal) {
  if (!causal) return cols;
  const int64_t l = (int64_t)((unsigned)row % (unsigned)tq) + diag + 1;
  return (int)(l < 0 ? 0 : (l < cols ? l : cols));
}

// VEC elements from column c0: one 16-byte load when all are unmasked, else element by element.
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

// Which row, and which slice of it, this thread works on. Register path: ROWS rows per block, L
// threads per row, the whole row. Cluster path: one row per cluster; CTA r of the cluster takes the
// columns [r * SLICE, (r + 1) * SLICE).
template <int L, int ROWS, int SLICE, bool CLUSTER>
__device__ __forceinline__ void locate(int64_t& row, int& base) {
  if constexpr (CLUSTER) {
    const unsigned n = cg::this_cluster().num_blocks();
    row = blockIdx.x / n;
    base = (int)(blockIdx.x % n) * SLICE;
  } else {
    row = (int64_t)blockIdx.x * ROWS + threadIdx.x / L;
    base = 0;
  }
}

// ---------------------------------------------------------------------------------------------
// register and cluster paths
// ---------------------------------------------------------------------------------------------
template <typename T, int VEC, int ITEMS, int L, int ROWS, bool CLUSTER>
__global__ void __launch_bounds__(L* ROWS)
    fwd_register_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int cols,
                        int64_t x_stride, int64_t tq, int64_t diag, float c, bool causal) {
  constexpr int NV = ITEMS / VEC;
  __shared__ float2 red[32];
  __shared__ float2 slot;
  const int lane = threadIdx.x % L;
  int64_t row;
  int base;
  locate<L, ROWS, L * ITEMS, CLUSTER>(row, base);
  const bool row_ok = row < rows;
  const int lim = row_ok ? row_limit(row, cols, tq, diag, causal) : 0;
  const T* xr = x + (row_ok ? row : 0) * x_stride;

  // load (unmasked prefix only) and this thread's max of x * c
  float v[ITEMS];
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int c0 = base + (i * L + lane) * VEC;
    if (c0 + VEC <= lim) {
      const Pack<T, VEC> p = *reinterpret_cast<const Pack<T, VEC>*>(xr + c0);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        v[i * VEC + j] = Cvt<T>::load(p.v[j]);
        m = fmaxf(m, v[i * VEC + j] * c);
      }
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const bool keep = c0 + j < lim;
        v[i * VEC + j] = keep ? Cvt<T>::load(xr[c0 + j]) : 0.f;
        if (keep) m = fmaxf(m, v[i * VEC + j] * c);
      }
    }
  }
  // exponentials relative to this thread's max: exp2(x * c - m) in one fma (x * c is never rounded)
  const float ref = m == -INFINITY ? 0.f : m;
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int c0 = base + (i * L + lane) * VEC;
    if (c0 + VEC <= lim) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float e = fast_exp2(fmaf(v[i * VEC + j], c, -ref));
        v[i * VEC + j] = e;
        s += e;
      }
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float e = c0 + j < lim ? fast_exp2(fmaf(v[i * VEC + j], c, -ref)) : 0.f;
        v[i * VEC + j] = e;
        s += e;
      }
    }
  }
  // one merged (max, sum) reduction over the row (and the cluster), then rescale to the row max
  float M = m, S = s;
  row_stats<L>(M, S, red);
  if constexpr (CLUSTER) cluster_stats(M, S, &slot);
  const float Mref = M == -INFINITY ? 0.f : M;
  const float f = fast_exp2(ref - Mref) / (S == 0.f ? 1.f : S);  // NaN stays NaN
  if (!row_ok) return;
  T* yr = y + row * cols;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int c0 = base + (i * L + lane) * VEC;
    if (c0 >= cols) continue;  // cols is a multiple of VEC on this path
    Pack<T, VEC> o;
    if (c0 + VEC <= lim) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) o.v[j] = Cvt<T>::store(v[i * VEC + j] * f);
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) o.v[j] = Cvt<T>::store(c0 + j < lim ? v[i * VEC + j] * f : 0.f);
    }
    *reinterpret_cast<Pack<T, VEC>*>(yr + c0) = o;
  }
}

template <typename T, int VEC, int ITEMS, int L, int ROWS, bool CLUSTER>
__global__ void __launch_bounds__(L* ROWS)
    bwd_register_kernel(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx,
                        int64_t rows, int cols, int64_t dy_stride, int64_t tq, int64_t diag,
                        float scale, bool causal) {
  constexpr int NV = ITEMS / VEC;
  __shared__ float2 red[32];
  __shared__ float2 slot;
  const int lane = threadIdx.x % L;
  int64_t row;
  int base;
  locate<L, ROWS, L * ITEMS, CLUSTER>(row, base);
  const bool row_ok = row < rows;
  const int lim = row_ok ? row_limit(row, cols, tq, diag, causal) : 0;
  const T* yr = y + (row_ok ? row : 0) * cols;
  const T* gr = dy + (row_ok ? row : 0) * dy_stride;

  float yv[ITEMS], gv[ITEMS];
  float dot = 0.f;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int c0 = base + (i * L + lane) * VEC;
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
        const bool keep = c0 + j < lim;
        yv[i * VEC + j] = keep ? Cvt<T>::load(yr[c0 + j]) : 0.f;
        gv[i * VEC + j] = keep ? Cvt<T>::load(gr[c0 + j]) : 0.f;
      }
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) dot += yv[i * VEC + j] * gv[i * VEC + j];
  }
  dot = row_sum<L>(dot, red);
  if constexpr (CLUSTER) dot = cluster_sum(dot, &slot);
  if (!row_ok) return;
  T* xr = dx + row * cols;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int c0 = base + (i * L + lane) * VEC;
    if (c0 >= cols) continue;
    Pack<T, VEC> o;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const int k = i * VEC + j;
      o.v[j] = Cvt<T>::store(c0 + j < lim ? scale * yv[k] * (gv[k] - dot) : 0.f);
    }
    *reinterpret_cast<Pack<T, VEC>*>(xr + c0) = o;
  }
}

// ---------------------------------------------------------------------------------------------
// stream path: a block per row, two passes over global memory
// ---------------------------------------------------------------------------------------------
template <typename T, int VEC>
__global__ void __launch_bounds__(kStreamThreads)
    fwd_stream_kernel(const T* __restrict__ x, T* __restrict__ y, int cols, int64_t x_stride, int64_t tq,
                      int64_t diag, float c, bool causal) {
  __shared__ float2 red[32];
  constexpr int STEP = kStreamThreads * VEC;
  const int64_t row = blockIdx.x;
  const int lim = row_limit(row, cols, tq, diag, causal);
  const T* xr = x + row * x_stride;

  // pass 1: online max and rescaled sum over this thread's chunks
  float m = -INFINITY, s = 0.f;
#pragma unroll 4
  for (int c0 = threadIdx.x * VEC; c0 < lim; c0 += STEP) {
    const Pack<T, VEC> p = load_prefix<T, VEC>(xr, c0, lim);
    float mm = -INFINITY;
#pragma unroll
    for (int j = 0; j < VEC; ++j)
      if (c0 + j < lim) mm = fmaxf(mm, Cvt<T>::load(p.v[j]) * c);
    const float mn = fmaxf(m, mm);
    const float ref = mn == -INFINITY ? 0.f : mn;
    float add = 0.f;
#pragma unroll
    for (int j = 0; j < VEC; ++j)
      if (c0 + j < lim) add += fast_exp2(fmaf(Cvt<T>::load(p.v[j]), c, -ref));
    s = s * fast_exp2(m - ref) + add;
    m = mn;
  }
  block_stats<kStreamThreads>(m, s, red);
  if (m == -INFINITY) m = 0.f;
  const float inv = 1.f / (s == 0.f ? 1.f : s);

  // pass 2, over this thread's chunks backwards (the most recently read first)
  T* yr = y + row * (int64_t)cols;
  const int first = threadIdx.x * VEC;
  if (first >= cols) return;
  for (int k = (cols - 1 - first) / STEP; k >= 0; --k) {
    const int c0 = first + k * STEP;
    const Pack<T, VEC> p = load_prefix<T, VEC>(xr, c0, lim);
    Pack<T, VEC> o;
#pragma unroll
    for (int j = 0; j < VEC; ++j)
      o.v[j] = Cvt<T>::store(c0 + j < lim ? fast_exp2(fmaf(Cvt<T>::load(p.v[j]), c, -m)) * inv : 0.f);
    store_row<T, VEC>(yr, c0, cols, o);
  }
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kStreamThreads)
    bwd_stream_kernel(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, int cols,
                      int64_t dy_stride, int64_t tq, int64_t diag, float scale, bool causal) {
  __shared__ float2 red[32];
  constexpr int STEP = kStreamThreads * VEC;
  const int64_t row = blockIdx.x;
  const int lim = row_limit(row, cols, tq, diag, causal);
  const T* yr = y + row * (int64_t)cols;
  const T* gr = dy + row * dy_stride;

  float acc = 0.f;
#pragma unroll 4
  for (int c0 = threadIdx.x * VEC; c0 < lim; c0 += STEP) {
    const Pack<T, VEC> a = load_prefix<T, VEC>(yr, c0, lim);
    const Pack<T, VEC> b = load_prefix<T, VEC>(gr, c0, lim);
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc += Cvt<T>::load(a.v[j]) * Cvt<T>::load(b.v[j]);
  }
  const float dot = row_sum<kStreamThreads>(acc, red);

  T* xr = dx + row * (int64_t)cols;
  const int first = threadIdx.x * VEC;
  if (first >= cols) return;
  for (int k = (cols - 1 - first) / STEP; k >= 0; --k) {
    const int c0 = first + k * STEP;
    const Pack<T, VEC> a = load_prefix<T, VEC>(yr, c0, lim);
    const Pack<T, VEC> b = load_prefix<T, VEC>(gr, c0, lim);
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
constexpr int kItems = 32;        // elements per thread on the register and cluster paths
constexpr int kMaxCluster = 8;    // portable cluster size (small slices)
constexpr int kMaxClusterLarge = 16;  // non-portable (Hopper allows 16) for the large slices
// Longest rows one block keeps in registers (forward / backward), by element size.
template <typename T>
constexpr int reg_max_fwd() {
  return sizeof(T) == 2 ? 16384 : 8192;
}
template <typename T>
constexpr int reg_max_bwd() {
  return sizeof(T) == 2 ? 16384 : 8192;
}
// Cluster slices (threads per CTA): a small slice first (more CTAs in flight), a large one for the
// longest rows; beyond kMaxCluster large slices the stream path takes over.
constexpr int kSmallSliceThreads = 256;
template <typename T>
constexpr int large_slice_threads(bool) {
  return 512;
}

template <typename T, int BLOCK_N>
struct RegCfg {
  static constexpr int VEC = vec_of<T>();
  static constexpr int ITEMS = BLOCK_N < kItems ? BLOCK_N : kItems;
  static constexpr int L = BLOCK_N / ITEMS;                           // threads per row
  static constexpr int ROWS = L >= 32 ? (L == 32 ? 8 : 1) : 256 / L;  // rows per block
  static_assert(ITEMS % VEC == 0 && L * ITEMS == BLOCK_N && L * ROWS <= 1024, "bad register config");
};

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

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
  fwd_register_kernel<T, C::VEC, C::ITEMS, C::L, C::ROWS, false><<<(unsigned)blocks, C::L * C::ROWS, 0, a.stream>>>(
      static_cast<const T*>(a.a), static_cast<T*>(a.out), a.rows, (int)a.cols, a.stride, a.tq, a.diag,
      a.scale * kLog2e, a.causal);
  return cudaGetLastError();
}

template <typename T, int BLOCK_N>
cudaError_t launch_bwd_register(const Args& a) {
  using C = RegCfg<T, BLOCK_N>;
  const int64_t blocks = (a.rows + C::ROWS - 1) / C::ROWS;
  bwd_register_kernel<T, C::VEC, C::ITEMS, C::L, C::ROWS, false><<<(unsigned)blocks, C::L * C::ROWS, 0, a.stream>>>(
      static_cast<const T*>(a.a), static_cast<const T*>(a.b), static_cast<T*>(a.out), a.rows, (int)a.cols,
      a.stride, a.tq, a.diag, a.scale, a.causal);
  return cudaGetLastError();
}

inline cudaLaunchConfig_t cluster_config(const Args& a, int threads, int n_ctas, cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)(a.rows * n_ctas));
  cfg.blockDim = dim3((unsigned)threads);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = a.stream;
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = (unsigned)n_ctas;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

template <typename Kernel>
cudaError_t allow_cluster(Kernel kernel, int n_ctas) {
  if (n_ctas <= 8) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
}

template <typename T, int L>
cudaError_t launch_fwd_cluster(const Args& a, int n_ctas) {
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t cfg = cluster_config(a, L, n_ctas, attr);
  constexpr int VEC = vec_of<T>();
  auto kernel = fwd_register_kernel<T, VEC, kItems, L, 1, true>;
  cudaError_t err = allow_cluster(kernel, n_ctas);
  if (err == cudaSuccess)
    err = cudaLaunchKernelEx(&cfg, kernel, static_cast<const T*>(a.a), static_cast<T*>(a.out), a.rows, (int)a.cols,
                             a.stride, a.tq, a.diag, a.scale * kLog2e, a.causal);
  return err;
}

template <typename T, int L>
cudaError_t launch_bwd_cluster(const Args& a, int n_ctas) {
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t cfg = cluster_config(a, L, n_ctas, attr);
  constexpr int VEC = vec_of<T>();
  auto kernel = bwd_register_kernel<T, VEC, kItems, L, 1, true>;
  cudaError_t err = allow_cluster(kernel, n_ctas);
  if (err == cudaSuccess)
    err = cudaLaunchKernelEx(&cfg, kernel, static_cast<const T*>(a.a), static_cast<const T*>(a.b),
                             static_cast<T*>(a.out), a.rows, (int)a.cols, a.stride, a.tq, a.diag, a.scale, a.causal);
  return err;
}

template <typename T, int VEC>
cudaError_t launch_fwd_stream(const Args& a) {
  fwd_stream_kernel<T, VEC><<<(unsigned)a.rows, kStreamThreads, 0, a.stream>>>(
      static_cast<const T*>(a.a), static_cast<T*>(a.out), (int)a.cols, a.stride, a.tq, a.diag,
      a.scale * kLog2e, a.causal);
  return cudaGetLastError();
}

template <typename T, int VEC>
cudaError_t launch_bwd_stream(const Args& a) {
  bwd_stream_kernel<T, VEC><<<(unsigned)a.rows, kStreamThreads, 0, a.stream>>>(
      static_cast<const T*>(a.a), static_cast<const T*>(a.b), static_cast<T*>(a.out), (int)a.cols, a.stride,
      a.tq, a.diag, a.scale, a.causal);
  return cudaGetLastError();
}

template <typename T>
bool is_aligned(const Args& a, bool backward) {
  constexpr int VEC = vec_of<T>();
  bool ok = a.cols % VEC == 0 && a.stride % VEC == 0 && aligned16(a.a) && aligned16(a.out);
  if (backward) ok = ok && aligned16(a.b);
  return ok;
}

enum class Path { Register, ClusterSmall, ClusterLarge, Stream };

template <typename T>
Path choose_path(int64_t cols, bool aligned, bool backward) {
  if (!aligned) return Path::Stream;
  if (cols <= (backward ? reg_max_bwd<T>() : reg_max_fwd<T>())) return Path::Register;
  if (cols <= (int64_t)kMaxCluster * kSmallSliceThreads * kItems) return Path::ClusterSmall;
  if (cols <= (int64_t)kMaxClusterLarge * large_slice_threads<T>(backward) * kItems) return Path::ClusterLarge;
  return Path::Stream;
}

inline int ctas_for(int64_t cols, int threads) { return (int)((cols + (int64_t)threads * kItems - 1) / (threads * kItems)); }

#define REG_CASE(BN, LAUNCH, MAX)                                            \
  case BN:                                                                   \
    if constexpr (BN >= vec_of<T>() && BN <= (MAX)) return LAUNCH<T, BN>(a); \
    break;

template <typename T>
cudaError_t fwd_dispatch(const Args& a) {
  constexpr int VEC = vec_of<T>();
  const bool aligned = is_aligned<T>(a, false);
  switch (choose_path<T>(a.cols, aligned, false)) {
    case Path::Register:
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
        default:
          break;
      }
      return cudaErrorInvalidConfiguration;
    case Path::ClusterSmall:
      return launch_fwd_cluster<T, kSmallSliceThreads>(a, ctas_for(a.cols, kSmallSliceThreads));
    case Path::ClusterLarge: {
      const cudaError_t err =
          launch_fwd_cluster<T, large_slice_threads<T>(false)>(a, ctas_for(a.cols, large_slice_threads<T>(false)));
      if (err == cudaSuccess) return err;
      (void)cudaGetLastError();  // clear it: the stream path takes over
      break;
    }
    case Path::Stream:
      break;
  }
  return aligned ? launch_fwd_stream<T, VEC>(a) : launch_fwd_stream<T, 1>(a);
}

template <typename T>
cudaError_t bwd_dispatch(const Args& a) {
  constexpr int VEC = vec_of<T>();
  const bool aligned = is_aligned<T>(a, true);
  switch (choose_path<T>(a.cols, aligned, true)) {
    case Path::Register:
      switch (next_pow2_at_least(a.cols, VEC)) {
        REG_CASE(4, launch_bwd_register, reg_max_bwd<T>())
        REG_CASE(8, launch_bwd_register, reg_max_bwd<T>())
        REG_CASE(16, launch_bwd_register, reg_max_bwd<T>())
        REG_CASE(32, launch_bwd_register, reg_max_bwd<T>())
        REG_CASE(64, launch_bwd_register, reg_max_bwd<T>())
        REG_CASE(128, launch_bwd_register, reg_max_bwd<T>())
        REG_CASE(256, launch_bwd_register, reg_max_bwd<T>())
        REG_CASE(512, launch_bwd_register, reg_max_bwd<T>())
        REG_CASE(1024, launch_bwd_register, reg_max_bwd<T>())
        REG_CASE(2048, launch_bwd_register, reg_max_bwd<T>())
        REG_CASE(4096, launch_bwd_register, reg_max_bwd<T>())
        REG_CASE(8192, launch_bwd_register, reg_max_bwd<T>())
        REG_CASE(16384, launch_bwd_register, reg_max_bwd<T>())
        default:
          break;
      }
      return cudaErrorInvalidConfiguration;
    case Path::ClusterSmall:
      return launch_bwd_cluster<T, kSmallSliceThreads>(a, ctas_for(a.cols, kSmallSliceThreads));
    case Path::ClusterLarge: {
      const cudaError_t err =
          launch_bwd_cluster<T, large_slice_threads<T>(true)>(a, ctas_for(a.cols, large_slice_threads<T>(true)));
      if (err == cudaSuccess) return err;
      (void)cudaGetLastError();
      break;
    }
    case Path::Stream:
      break;
  }
  return aligned ? launch_bwd_stream<T, VEC>(a) : launch_bwd_stream<T, 1>(a);
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
  Path p;
  if (dtype == DType::F32)
    p = choose_path<float>(cols, aligned, backward);
  else
    p = choose_path<__half>(cols, aligned, backward);
  switch (p) {
    case Path::Register:
      return "register";
    case Path::ClusterSmall:
    case Path::ClusterLarge:
      return "cluster";
    case Path::Stream:
      return "stream";
  }
  return "stream";
}

}  // namespace softmax_harness
