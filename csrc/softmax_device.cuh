// Device side of the fused scale + causal mask + softmax kernels (CUDA C++, no torch header):
// the kernels and their helpers, as templates. Included by softmax_kernels.cu (the launchers and the
// launch table) and by softmax_tuning.cu (the variants the launch table was chosen from).
//
// Code paths:
//  * register: the row stays in registers (loaded with 16-byte vectors, all of a thread's loads issued
//    before the first is used, fp32 math). L threads share a row, NV vectors (ITEMS = NV * VEC
//    elements) each: L <= 32 packs several rows into one warp (short rows), L > 32 is a block per row.
//    One pass over memory each way. Two reduction schemes: MERGED = false
//    reduces the row max, then exponentiates once per element and reduces the sum (two reductions);
//    MERGED = true exponentiates against its warp's max and combines the warps' (max, sum) pairs after
//    one barrier (online-softmax merge, merged_stats), rescaling each element once at the end.
//  * cluster: the register kernel with SPAN = kCluster: a long row is split over a thread-block cluster
//    (Hopper, up to 16 CTAs); each CTA keeps its slice in registers and the CTAs exchange their
//    partials once through distributed shared memory (stores into each peer's slots plus an mbarrier
//    arrival there: no cluster-wide barrier on the critical path). Still one pass over memory each way.
//  * split: the register kernel with SPAN = kSplit: a long row is split over ordinary blocks, one slice
//    each, that combine their partials through global memory: each block publishes its slice's partial,
//    counts itself in the row's arrival counter (release) and waits until every slice of the row has
//    arrived (acquire). Blocks take their slice from a ticket counter, so the slices of a row start in
//    ticket order and a waiting block only ever waits for blocks already running: no deadlock while a
//    row's slices fit on the GPU at once (the host caps them at kMaxSplits). No cluster-scheduling
//    constraints, several blocks per SM; one pass over memory each way.
//  * persist: a block per SM loops over rows (one row at a time, L threads); each thread prefetches
//    its own 16-byte vectors of the next B rows into shared memory with cp.async (B buffers), so the
//    loads of later rows are in flight while this row is reduced and written: one long row per SM no
//    longer leaves the memory system idle between rows. A thread reads back only what it copied: no
//    barrier for the staging. The first row is loaded straight into registers. Full rows (exactly the
//    tile, not causal) run a copy of the loop without per-vector checks. C > 1: the row over a
//    cluster of C CTAs, one exchange per row (as above).
//  * hybrid: a 16-bit row too long for one block's registers, a block per row: part of it in registers
//    (packed), the rest copied into shared memory with cp.async by the thread that reads it back (no
//    barrier for the staging); two blocks per SM, so one's reduction overlaps the other's memory
//    traffic. One pass over memory each way.
//  * stream: rows of any length (no cap) and unaligned rows: a block per row, two passes over global
//    memory, the second walking backwards so the chunks read last (still in L2) come first.
// Register, cluster, split, persist and hybrid paths need 16-byte alignment (cols and the row stride
// multiples of the vector width, aligned base pointers). Causal rows load only their unmasked prefix
// and write zeros after it; on the forward's register, cluster, split, persistent and hybrid paths the
// masked columns read as a fill whose scaled score is -inf (see fill_word), so the math after the
// loads carries no per-element mask.
// Math in fp32 with exp2; maxima on the keys x * sign(c), exponents (x - max * sign(c)) * c, exactly
// 0 at the max at any magnitude (see sign_of); NaN propagates within its row; a row with no unmasked
// key (or all -inf) gives zeros.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <atomic>
#include <type_traits>

namespace softmax_harness {
namespace detail {

namespace cg = cooperative_groups;

constexpr float kLog2e = 1.4426950408889634f;

// How a row maps onto blocks: inside one block (several rows per block when short), over a cluster,
// or split over ordinary blocks that meet in global memory.
enum Span : int { kBlock = 0, kCluster = 1, kSplit = 2 };

// Workspace of the split path (zeroed counters before each launch): cnt[0] is the ticket counter,
// cnt[1 + row] the row's arrival counter; stats holds the row's `splits` partials.
struct SplitWs {
  unsigned* cnt;
  float2* stats;
  int splits;
};
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

// A 16-byte vector kept as four 32-bit words (two 16-bit elements per word), so 16-bit rows held in
// registers take half the registers of fp32 copies (a 16-bit value alone would occupy a whole register).
// get: element j as fp32. get_again: the same, opaque to the compiler (volatile asm), so a second use
// re-converts from the word instead of keeping the fp32 copy alive.
__device__ __forceinline__ unsigned word_of(const uint4& w, int i) {
  return i == 0 ? w.x : i == 1 ? w.y : i == 2 ? w.z : w.w;
}
template <typename T>
struct Words;
template <>
struct Words<float> {
  static __device__ __forceinline__ float get(const uint4& w, int j) { return __uint_as_float(word_of(w, j)); }
  static __device__ __forceinline__ float get_again(const uint4& w, int j) { return get(w, j); }
};
template <>
struct Words<__nv_bfloat16> {
  static __device__ __forceinline__ float get(const uint4& w, int j) {
    const unsigned u = word_of(w, j >> 1);
    return __uint_as_float((j & 1) ? (u & 0xffff0000u) : (u << 16));
  }
  static __device__ __forceinline__ float get_again(const uint4& w, int j) {
    const unsigned u = word_of(w, j >> 1);
    unsigned r;
    if (j & 1)
      asm volatile("and.b32 %0, %1, 0xffff0000;" : "=r"(r) : "r"(u));
    else
      asm volatile("shl.b32 %0, %1, 16;" : "=r"(r) : "r"(u));
    return __uint_as_float(r);
  }
};
template <>
struct Words<__half> {
  static __device__ __forceinline__ float get(const uint4& w, int j) {
    const unsigned u = word_of(w, j >> 1);
    return __half2float(__ushort_as_half((unsigned short)((j & 1) ? (u >> 16) : (u & 0xffffu))));
  }
  static __device__ __forceinline__ float get_again(const uint4& w, int j) {
    const unsigned u = word_of(w, j >> 1);
    float f;
    if (j & 1)
      asm volatile("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.f32.f16 %0, hi;\n}" : "=f"(f) : "r"(u));
    else
      asm volatile("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.f32.f16 %0, lo;\n}" : "=f"(f) : "r"(u));
    return f;
  }
};

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

// The 16-byte vector at column c0 if it holds an unmasked column (c0 < lim), else zeros. No branch:
// a predicated load, so a thread's loads of a row are all issued before the first is used. A vector
// that straddles lim is read whole (it lies inside the row: cols is a multiple of VEC wherever this
// is used); the caller masks its columns >= lim.
template <typename T, int VEC>
__device__ __forceinline__ uint4 load_vec(const T* p, int c0, int lim) {
  uint4 w = make_uint4(0u, 0u, 0u, 0u);
  if (c0 < lim) w = *reinterpret_cast<const uint4*>(p + c0);
  return w;
}

// 2^x with the SFU instruction (relative error ~2^-22, what Triton's tl.exp2 uses as well).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// ---------------------------------------------------------------------------------------------
// reductions
// ---------------------------------------------------------------------------------------------
// Maxima are taken on the keys x * sign(c) (exact), not on x * c: an element's exponent is then
// (x - ref * sign(c)) * c = (key - ref) * |c|, exactly 0 at the row's max whatever its magnitude.
// (exp2(fma(x, c, -round(max * c))) shifts every exponent by the max's rounding error, up to
// |max * c| / 2^25, which overflows or underflows exp2 beyond |max * c| ~ 2^32.)
__device__ __forceinline__ float sign_of(float c) { return copysignf(1.f, c); }  // (c > 0 ? 1 : -1 for c != 0)

// A sum s of exponentials relative to key max m, brought to the reference ref (a = |c| > 0: an empty
// part, m = -inf, adds 0; the stream path, whose scale may be 0, starts its maxima at -FLT_MAX).
__device__ __forceinline__ float rescaled(float s, float m, float ref, float a) {
  return s * fast_exp2((m - ref) * a);
}

// Merge two (max, sum) partials of an online softmax (maxima of keys, sums relative to them, exp2
// domain, a = |c|). -inf maxima (nothing unmasked yet) merge without NaN; a NaN sum stays NaN.
__device__ __forceinline__ void merge_stats(float& m, float& s, float mo, float so, float a) {
  const float mn = fmaxf(m, mo);
  const float ref = mn == -INFINITY ? 0.f : mn;
  s = rescaled(s, m, ref, a) + rescaled(so, mo, ref, a);
  m = mn;
}

// Butterfly max / sum over aligned groups of W lanes (W a power of two, at most 32): every lane of a
// group gets its group's result.
template <int W>
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = W / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o, W));
  return v;
}
template <int W>
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = W / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o, W);
  return v;
}

// Reductions over the L threads of one row; every thread gets the result. L <= 32: inside a warp
// (rows never straddle warps). L > 32: the block is one row; each warp leaves its partial in `red`,
// one barrier, then every warp combines all partials itself. One barrier per reduction: each `red`
// buffer serves one reduction per kernel, so nothing is overwritten while another warp reads it.
template <int L>
__device__ __forceinline__ void row_stats(float& m, float& s, float2* red, float a) {
  constexpr int W = L < 32 ? L : 32;
#pragma unroll
  for (int o = W / 2; o > 0; o >>= 1) {
    const float mo = __shfl_xor_sync(0xffffffffu, m, o, W);
    const float so = __shfl_xor_sync(0xffffffffu, s, o, W);
    merge_stats(m, s, mo, so, a);
  }
  if constexpr (L > 32) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) red[warp] = make_float2(m, s);
    __syncthreads();
    const float2 v = lane < L / 32 ? red[lane] : make_float2(-FLT_MAX, 0.f);  // (the stream path's start)
    m = v.x;
    s = v.y;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float mo = __shfl_xor_sync(0xffffffffu, m, o);
      const float so = __shfl_xor_sync(0xffffffffu, s, o);
      merge_stats(m, s, mo, so, a);
    }
  }
}

// One-pass (merged) statistics of a row from each thread's max m of x * c: the max over the warp (over
// the row's W lanes when L <= 32), this thread's exponentials against it (exp_sum(ref) returns their
// sum), the warp's sum; L > 32: the warps' (max, sum) pairs meet in `red` after one barrier, and
// every warp takes the row max of them and the sum of their sums rescaled to it. Returns ref (the
// warp max, 0 if -inf); M, S: the row max and the row's sum of exp2(x * c - M). A max and a sum per
// shuffle step, not a (max, sum) merge (two exponentials) at every step as in row_stats.
template <int L, typename ExpSum>
__device__ __forceinline__ float merged_stats(float m, ExpSum&& exp_sum, float2* red, float& M, float& S, float a) {
  constexpr int W = L < 32 ? L : 32;
  m = warp_max<W>(m);
  const float ref = m == -INFINITY ? 0.f : m;
  const float s = warp_sum<W>(exp_sum(ref));
  M = m;
  S = s;
  if constexpr (L > 32) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) red[warp] = make_float2(m, s);
    __syncthreads();
    const float2 p = lane < L / 32 ? red[lane] : make_float2(-INFINITY, 0.f);
    M = warp_max<32>(p.x);
    S = warp_sum<32>(rescaled(p.y, p.x, M == -INFINITY ? 0.f : M, a));  // a warp with nothing unmasked adds 0
  }
  return ref;
}

template <int L>
__device__ __forceinline__ float row_sum(float v, float* red) {
  v = warp_sum<(L < 32 ? L : 32)>(v);
  if constexpr (L > 32) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = warp_sum<32>(lane < L / 32 ? red[lane] : 0.f);
  }
  return v;
}

template <int L>
__device__ __forceinline__ float row_max(float v, float* red) {
  v = warp_max<(L < 32 ? L : 32)>(v);
  if constexpr (L > 32) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = warp_max<32>(lane < L / 32 ? red[lane] : -INFINITY);
  }
  return v;
}

// Persistent clusters exchange one partial per row without a cluster-wide barrier: each CTA keeps,
// per row parity, an mbarrier expecting C - 1 arrivals and C slots. Thread t < C (t != own rank)
// stores this CTA's partial into CTA t's slot [own rank] (distributed shared memory) and arrives
// (release, cluster scope) on CTA t's mbarrier; every thread waits on its own mbarrier (acquire) and
// merges the C partials in rank order, its own from registers: the same result in every CTA. A slot
// of parity p is written again only for row k + 2, which no peer reaches before this CTA has sent
// its row k + 1 partial, i.e. after all its threads passed row k + 1's block barrier (done reading).
template <typename V, int C>
struct ClusterXchg {
  uint64_t bar[2];
  V val[2][C];
};

__device__ __forceinline__ unsigned smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ unsigned map_to_rank(unsigned addr, unsigned rank) {
  unsigned out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(addr), "r"(rank));
  return out;
}
__device__ __forceinline__ void st_cluster(unsigned addr, float2 v) {
  asm volatile("st.shared::cluster.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(v.x), "f"(v.y) : "memory");
}
__device__ __forceinline__ void st_cluster(unsigned addr, float v) {
  asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(unsigned bar, unsigned parity) {
  unsigned done;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
      " selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}

// Before the first exchange: the mbarriers initialized and visible to the whole cluster.
template <typename V, int C>
__device__ __forceinline__ void xchg_init(ClusterXchg<V, C>& x) {
  if (threadIdx.x == 0) {
#pragma unroll
    for (int p = 0; p < 2; ++p)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(&x.bar[p])), "r"(C - 1) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  cg::this_cluster().sync();
}

// Row k's partials of all C CTAs (this one's is `mine`, the same in all its threads), each passed to
// merge(v) in rank order.
template <typename V, int C, typename Merge>
__device__ __forceinline__ void xchg(ClusterXchg<V, C>& x, unsigned rank, int k, V mine, Merge&& merge) {
  const int p = k & 1;
  if (threadIdx.x < C && threadIdx.x != rank) {
    st_cluster(map_to_rank(smem_u32(&x.val[p][rank]), threadIdx.x), mine);
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(
                     map_to_rank(smem_u32(&x.bar[p]), threadIdx.x))
                 : "memory");
  }
  while (!mbar_try_wait(smem_u32(&x.bar[p]), (unsigned)(k >> 1) & 1u)) {
  }
#pragma unroll
  for (int r = 0; r < C; ++r) merge(r == (int)rank ? mine : x.val[p][r]);
}

// Register-path clusters (one row per cluster, n <= 16 CTAs: the launchers never ask for more; n known
// at run time): one exchange per
// kernel, through the same scheme. cluster_begin() right after the loads are issued: the mbarrier
// initialized and a cluster barrier arrived at; cluster_xchg() waits on that barrier (every peer's
// mbarrier initialized: the wait overlaps the loads), exchanges, and arrives at a closing barrier
// that cluster_end() waits on just before exit (no CTA leaves while a peer's store into it may be in
// flight; the wait overlaps the output stores).
template <typename V>
struct ClusterSlots {
  uint64_t bar;
  V val[16];
};

template <typename V>
__device__ __forceinline__ void cluster_begin(ClusterSlots<V>& x, unsigned n) {
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(&x.bar)), "r"(n - 1) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}

template <typename V, typename Merge>
__device__ __forceinline__ void cluster_xchg(ClusterSlots<V>& x, unsigned n, unsigned rank, V mine, Merge&& merge) {
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
  if (threadIdx.x < n && threadIdx.x != rank) {
    st_cluster(map_to_rank(smem_u32(&x.val[rank]), threadIdx.x), mine);
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(
                     map_to_rank(smem_u32(&x.bar), threadIdx.x))
                 : "memory");
  }
  while (!mbar_try_wait(smem_u32(&x.bar), 0u)) {
  }
  for (unsigned r = 0; r < n; ++r) merge(r == rank ? mine : x.val[r]);
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void cluster_end() { asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory"); }

// Split path: thread 0 publishes the block's partial, arrives (release) and waits for the row's other
// slices (acquire); after a barrier warp 0 merges the row's partials (read from L2) and broadcasts.
// Every block of the row merges them in the same order: bit-identical statistics.
__device__ __forceinline__ void split_arrive_and_wait(const SplitWs& ws, int64_t row) {
  unsigned* c = ws.cnt + 1 + row;
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(c) : "memory");
  unsigned v;
  do {
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(c) : "memory");
  } while (v < (unsigned)ws.splits);
}

__device__ __forceinline__ void split_stats(float& m, float& s, const SplitWs& ws, int64_t row, int part,
                                            float2* bcast, float a) {
  float2* mine = ws.stats + row * ws.splits;
  if (threadIdx.x == 0) {
    mine[part] = make_float2(m, s);
    split_arrive_and_wait(ws, row);
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    float cm = -INFINITY, cs = 0.f;
    for (int k = threadIdx.x; k < ws.splits; k += 32) {
      const float2 o = __ldcg(mine + k);
      merge_stats(cm, cs, o.x, o.y, a);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float mo = __shfl_xor_sync(0xffffffffu, cm, o);
      const float so = __shfl_xor_sync(0xffffffffu, cs, o);
      merge_stats(cm, cs, mo, so, a);
    }
    if (threadIdx.x == 0) *bcast = make_float2(cm, cs);
  }
  __syncthreads();
  m = bcast->x;
  s = bcast->y;
}

__device__ __forceinline__ float split_sum(float v, const SplitWs& ws, int64_t row, int part, float* bcast) {
  float* mine = reinterpret_cast<float*>(ws.stats) + row * ws.splits;
  if (threadIdx.x == 0) {
    mine[part] = v;
    split_arrive_and_wait(ws, row);
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    float t = 0.f;
    for (int k = threadIdx.x; k < ws.splits; k += 32) t += __ldcg(mine + k);
    t = warp_sum<32>(t);
    if (threadIdx.x == 0) *bcast = t;
  }
  __syncthreads();
  return *bcast;
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
// columns [r * SLICE, (r + 1) * SLICE). Split path: the same slices, by ticket (see the top).
template <int L, int ROWS, int SLICE, int SPAN>
__device__ __forceinline__ void locate(int64_t& row, int& base, int& part, const SplitWs& ws) {
  part = 0;
  if constexpr (SPAN == kCluster) {
    const unsigned n = cg::this_cluster().num_blocks();
    row = blockIdx.x / n;
    part = (int)(blockIdx.x % n);
    base = part * SLICE;
  } else if constexpr (SPAN == kSplit) {
    __shared__ unsigned ticket;
    if (threadIdx.x == 0) ticket = atomicAdd(ws.cnt, 1u);
    __syncthreads();
    row = ticket / (unsigned)ws.splits;
    part = (int)(ticket % (unsigned)ws.splits);
    base = part * SLICE;
  } else {
    row = (int64_t)blockIdx.x * ROWS + threadIdx.x / L;
    base = 0;
  }
}

// ---------------------------------------------------------------------------------------------
// register and cluster paths
// ---------------------------------------------------------------------------------------------
// Blocks per SM to ask ptxas for (__launch_bounds__): enough to cap the registers near what the row
// data a thread holds needs (REGS 32-bit registers of it, in NV 16-byte vectors): 32 registers for up
// to 16 data registers in at most two vectors (or up to 16 held as packed words), 64 up to 32, else no
// cap. So big blocks do not run one per SM, where a block-wide barrier stalls the SM's memory stream.
constexpr int min_blocks(int threads, int regs, int nv, bool packed) {
  const int cap = regs <= 16 && (nv <= 2 || packed) ? 32 : regs <= 32 ? 64 : 255;
  const int b = 65536 / (threads * cap);
  return b < 1 ? 1 : (b > 32 ? 32 : b);
}

// Masked columns are read as the value whose scaled score x * c is -inf (-inf for c > 0, +inf for
// c < 0), so the math after the loads needs no per-element mask: the max ignores them, their
// exponentials are exactly 0 (so are their outputs), and they add 0 to the sum. The host sends only
// normal, finite c to these kernels (else the stream path, which masks element by element).
template <typename T>
__device__ __forceinline__ unsigned fill_word(float c) {  // one 32-bit word of fill values
  if constexpr (sizeof(T) == 4)
    return c > 0.f ? 0xff800000u : 0x7f800000u;
  else if constexpr (std::is_same_v<T, __half>)
    return c > 0.f ? 0xfc00fc00u : 0x7c007c00u;
  else
    return c > 0.f ? 0xff80ff80u : 0x7f807f80u;
}

// The vector with its elements k, k + 1, ... replaced by the fill (0 < k < VEC).
template <typename T>
__device__ __forceinline__ uint4 fill_from(uint4 w, int k, unsigned fill) {
  constexpr int PER = 4 / (int)sizeof(T);  // elements per word
  auto word = [&](unsigned u, int q) {
    const int j = q * PER;  // the word's first element
    const unsigned keep = j >= k ? 0u : (PER == 2 && j + 1 >= k ? 0x0000ffffu : 0xffffffffu);
    return (u & keep) | (fill & ~keep);
  };
  return make_uint4(word(w.x, 0), word(w.y, 1), word(w.z, 2), word(w.w, 3));
}

// The fill in this thread's vectors (vector i at column first + i * L * VEC) at and past column lim:
// only vectors that reach past lim are touched (one per row, plus the masked ones of causal rows).
template <typename T, int VEC, int NV, int L>
__device__ __forceinline__ void mask_tail(uint4* w, int first, int lim, unsigned fill) {
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int c0 = first + i * L * VEC;
    if (c0 >= lim)
      w[i] = make_uint4(fill, fill, fill, fill);
    else if (c0 + VEC > lim)
      w[i] = fill_from<T>(w[i], lim - c0, fill);
  }
}

// Max of the keys x * sign(c) over this thread's elements (see sign_of): max(x) for c > 0, -min(x)
// for c < 0; 16-bit pairs are compared packed (two per instruction). Like fmaxf, the comparisons skip
// NaN (a NaN still makes its row NaN through the sum).
template <typename T>
struct Pair;
template <>
struct Pair<__nv_bfloat16> {
  using type = __nv_bfloat162;
};
template <>
struct Pair<__half> {
  using type = __half2;
};
template <typename T, int NV>
__device__ __forceinline__ float max_key(const uint4* w, float c) {
  const bool pos = c > 0.f;
  if constexpr (sizeof(T) == 4) {
    float m = __uint_as_float(w[0].x);
#pragma unroll
    for (int i = 0; i < NV; ++i)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float v = __uint_as_float(word_of(w[i], q));
        m = pos ? fmaxf(m, v) : fminf(m, v);
      }
    return pos ? m : -m;
  } else {
    using P = typename Pair<T>::type;
    auto pair = [](unsigned u) {
      P p;
      memcpy(&p, &u, 4);
      return p;
    };
    P m = pair(w[0].x);
#pragma unroll
    for (int i = 0; i < NV; ++i)
#pragma unroll
      for (int q = 0; q < 4; ++q) m = pos ? __hmax2(m, pair(word_of(w[i], q))) : __hmin2(m, pair(word_of(w[i], q)));
    unsigned u;
    memcpy(&u, &m, 4);
    const uint4 r = make_uint4(u, 0u, 0u, 0u);
    const float lo = Words<T>::get(r, 0), hi = Words<T>::get(r, 1);
    return pos ? fmaxf(lo, hi) : -fminf(lo, hi);
  }
}

// v[k] <- exp2((x_k - r) * c) (r = the reference key ref * sign(c), see sign_of), x_k read from the
// row's words (masked columns hold the fill, whose exponential is 0); returns their sum. Vector i of
// this thread starts at column first + i * L * VEC.
template <typename T, int VEC, int NV>
__device__ __forceinline__ float exp_words(float* v, const uint4* w, float c, float r) {
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < NV; ++i)
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float e = fast_exp2((Words<T>::get(w[i], j) - r) * c);
      v[i * VEC + j] = e;
      s += e;
    }
  return s;
}

// Row outputs of this thread's vectors (vector i at column first + i * L * VEC; cols a multiple of VEC):
// element j of vector i is out(i, j), rounded to T, one 16-byte store per vector. FULL: the caller
// knows every vector lies inside the row (no per-vector check).
template <typename T, int VEC, int NV, int L, bool FULL = false, typename Out>
__device__ __forceinline__ void store_vectors(T* r, int first, int cols, Out&& out) {
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int c0 = first + i * L * VEC;
    if (!FULL && c0 >= cols) continue;
    Pack<T, VEC> o;
#pragma unroll
    for (int j = 0; j < VEC; ++j) o.v[j] = Cvt<T>::store(out(i, j));
    *reinterpret_cast<Pack<T, VEC>*>(r + c0) = o;
  }
}

// Forward: y = v * f (v: the exponentials, 0 where masked).
template <typename T, int VEC, int NV, int L, bool FULL = false>
__device__ __forceinline__ void store_scaled(T* yr, const float* v, int first, int cols, float f) {
  store_vectors<T, VEC, NV, L, FULL>(yr, first, cols, [&](int i, int j) { return v[i * VEC + j] * f; });
}

// Backward: dx = scale * y * (dy - dot) from the packed y and dy words, 0 past lim.
template <typename T, int VEC, int NV, int L>
__device__ __forceinline__ void store_dx(T* xr, const uint4* ya, const uint4* ga, int first, int cols, int lim,
                                         float scale, float dot) {
  store_vectors<T, VEC, NV, L>(xr, first, cols, [&](int i, int j) {
    const float yy = Words<T>::get_again(ya[i], j);
    return first + i * L * VEC + j < lim ? scale * yy * (Words<T>::get_again(ga[i], j) - dot) : 0.f;
  });
}

// Packed rows (the words as loaded, masked columns holding the fill): the sum of exp2((x - r) * c),
// and the outputs exp2((x - r) * c) * f (cols a multiple of VEC).
template <typename T, int VEC, int NV>
__device__ __forceinline__ float packed_exp_sum(const uint4* w, float c, float r) {
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < NV; ++i)
#pragma unroll
    for (int j = 0; j < VEC; ++j) s += fast_exp2((Words<T>::get_again(w[i], j) - r) * c);
  return s;
}

template <typename T, int VEC, int NV, int L, bool FULL = false>
__device__ __forceinline__ void store_exp(T* yr, const uint4* w, int first, int cols, float c, float r, float f) {
  store_vectors<T, VEC, NV, L, FULL>(
      yr, first, cols, [&](int i, int j) { return fast_exp2((Words<T>::get_again(w[i], j) - r) * c) * f; });
}

// PACKED (16-bit types): the row stays in registers as loaded (packed words, half the registers) and
// each kept element's exponential is computed twice, for the sum and for the output, instead of
// keeping fp32 exponentials: more SFU work (2 ex2 per element), fewer registers, more blocks per SM.
template <typename T, int VEC, int NV, int L, int ROWS, bool MERGED, bool PACKED, int SPAN>
__global__ void __launch_bounds__(L* ROWS, min_blocks(L * ROWS, PACKED ? NV * 4 : NV * VEC, NV, PACKED))
    fwd_register_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int cols,
                        int64_t x_stride, int64_t tq, int64_t diag, float c, bool causal, SplitWs ws) {
  constexpr int ITEMS = NV * VEC;
  constexpr bool CLUSTER = SPAN == kCluster, SPLIT = SPAN == kSplit;
  static_assert(!(SPLIT || CLUSTER) || MERGED, "split and cluster paths merge (max, sum) in one exchange");
  __shared__ float2 red_stats[MERGED && L > 32 ? 32 : 1];
  __shared__ float red_max[!MERGED && L > 32 ? 32 : 1], red_sum[!MERGED && L > 32 ? 32 : 1];
  __shared__ float2 slot_stats;
  __shared__ ClusterSlots<float2> cslots;
  const int lane = threadIdx.x % L;
  int64_t row;
  int base, part;
  locate<L, ROWS, L * ITEMS, SPAN>(row, base, part, ws);
  const bool row_ok = row < rows;
  const int lim = row_ok ? row_limit(row, cols, tq, diag, causal) : 0;
  const T* xr = x + (row_ok ? row : 0) * x_stride;
  const int first = base + lane * VEC;  // vector i of this thread starts at column first + i * L * VEC

  // load (the vectors of the unmasked prefix; all loads issued first), the fill past lim, and this
  // thread's max of x * c
  uint4 w[NV];
#pragma unroll
  for (int i = 0; i < NV; ++i) w[i] = load_vec<T, VEC>(xr, first + i * L * VEC, lim);
  const unsigned n_ctas = CLUSTER ? cg::this_cluster().num_blocks() : 1;
  if constexpr (CLUSTER) cluster_begin(cslots, n_ctas);
  mask_tail<T, VEC, NV, L>(w, first, lim, fill_word<T>(c));
  const float m = max_key<T, NV>(w, c);
  float v[PACKED ? 1 : ITEMS];  // unpacked: the exponentials, kept for the output
  // sum of exp2((key - ref) * |c|) = exp2((x - ref * sign(c)) * c); unpacked, the exponentials go to v
  auto exp_sum = [&](float ref) {
    if constexpr (PACKED) {
      return packed_exp_sum<T, VEC, NV>(w, c, (c > 0.f ? ref : -ref));
    } else {
      return exp_words<T, VEC, NV>(v, w, c, (c > 0.f ? ref : -ref));
    }
  };
  float ref, f;  // output = exp2((key - ref) * |c|) * f
  if constexpr (MERGED) {
    // exponentials relative to the warp's max, one barrier for the row's (max, sum) (merged over the
    // cluster or the split slices as well), and a rescale to the row max
    float M, S;
    ref = merged_stats<L>(m, exp_sum, red_stats, M, S, fabsf(c));
    if constexpr (CLUSTER) {
      float cm = -INFINITY, cs = 0.f;
      cluster_xchg(cslots, n_ctas, (unsigned)part, make_float2(M, S), [&](float2 o) { merge_stats(cm, cs, o.x, o.y, fabsf(c)); });
      M = cm;
      S = cs;
    }
    if constexpr (SPLIT) split_stats(M, S, ws, row, part, &slot_stats, fabsf(c));
    const float Mref = M == -INFINITY ? 0.f : M;
    f = fast_exp2((ref - Mref) * fabsf(c)) / (S == 0.f ? 1.f : S);  // NaN stays NaN
  } else {
    // the row max first, then one exponential per element against it, then the row sum
    const float M = row_max<L>(m, red_max);
    ref = M == -INFINITY ? 0.f : M;  // no unmasked key: every exponential below is 0
    const float S = row_sum<L>(exp_sum(ref), red_sum);
    f = 1.f / (S == 0.f ? 1.f : S);  // NaN stays NaN
  }
  if (row_ok) {  // (always, on the cluster and split paths: their grid is rows x slices)
    T* yr = y + row * cols;
    if constexpr (PACKED) {
      store_exp<T, VEC, NV, L>(yr, w, first, cols, c, (c > 0.f ? ref : -ref), f);
    } else {
      store_scaled<T, VEC, NV, L>(yr, v, first, cols, f);
    }
  }
  if constexpr (CLUSTER) cluster_end();
}

// y and dy stay in registers as loaded (packed words) and are converted where they are used.
// CAP: ask ptxas for min_blocks() blocks per SM (fewer registers, possibly spills), else one.
template <typename T, int VEC, int NV, int L, int ROWS, int SPAN, bool CAP>
__global__ void __launch_bounds__(L* ROWS, CAP ? min_blocks(L * ROWS, NV * 8, NV, true) : 1)
    bwd_register_kernel(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx,
                        int64_t rows, int cols, int64_t dy_stride, int64_t tq, int64_t diag,
                        float scale, bool causal, SplitWs ws) {
  constexpr bool CLUSTER = SPAN == kCluster, SPLIT = SPAN == kSplit;
  __shared__ float red[L > 32 ? 32 : 1];
  __shared__ float slot;
  __shared__ ClusterSlots<float> cslots;
  const int lane = threadIdx.x % L;
  int64_t row;
  int base, part;
  locate<L, ROWS, L * NV * VEC, SPAN>(row, base, part, ws);
  const bool row_ok = row < rows;
  const int lim = row_ok ? row_limit(row, cols, tq, diag, causal) : 0;
  const T* yr = y + (row_ok ? row : 0) * cols;
  const T* gr = dy + (row_ok ? row : 0) * dy_stride;
  const int first = base + lane * VEC;

  // all loads issued first (the vectors of the unmasked prefix), then the dot over the kept columns
  uint4 ya[NV], ga[NV];
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    ya[i] = load_vec<T, VEC>(yr, first + i * L * VEC, lim);
    ga[i] = load_vec<T, VEC>(gr, first + i * L * VEC, lim);
  }
  const unsigned n_ctas = CLUSTER ? cg::this_cluster().num_blocks() : 1;
  if constexpr (CLUSTER) cluster_begin(cslots, n_ctas);
  float dot = 0.f;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int c0 = first + i * L * VEC;
    const bool whole = c0 + VEC <= lim;
#pragma unroll
    for (int j = 0; j < VEC; ++j)
      if (whole || c0 + j < lim) dot += Words<T>::get(ya[i], j) * Words<T>::get(ga[i], j);
  }
  dot = row_sum<L>(dot, red);
  if constexpr (CLUSTER) {
    float total = 0.f;
    cluster_xchg(cslots, n_ctas, (unsigned)part, dot, [&](float o) { total += o; });
    dot = total;
  }
  if constexpr (SPLIT) dot = split_sum(dot, ws, row, part, &slot);
  if (row_ok) store_dx<T, VEC, NV, L>(dx + row * cols, ya, ga, first, cols, lim, scale, dot);
  if constexpr (CLUSTER) cluster_end();
}

// ---------------------------------------------------------------------------------------------
// persistent path (see the top): rows blockIdx.x, + gridDim.x, ...; B shared-memory buffers of one
// row's vectors each ([B][NV][L] x 16 bytes, dynamic shared memory)
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ void cp_async16(uint4* dst, const void* src, bool read) {
  const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(read ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async16(uint4* dst, const void* src) {  // all 16 bytes read
  const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int PENDING>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory");
}

// This thread's vectors of row r (those holding unmasked columns; the rest zero-filled, not read) in
// the slice starting at column `base` into buffer `buf`, as one commit group (empty past the last row,
// so every iteration commits one). FULL: every vector of every row is unmasked and inside the row.
template <typename T, int VEC, int NV, int L, bool FULL>
__device__ __forceinline__ void prefetch_row(uint4* buf, const T* src, int64_t r, int64_t rows, int cols, int base,
                                             int64_t stride, int64_t tq, int64_t diag, bool causal) {
  if (r < rows) {
    const int first = base + threadIdx.x * VEC;
    const T* p = src + r * stride + first;  // vector i at p + i * L * VEC
    if constexpr (FULL) {
#pragma unroll
      for (int i = 0; i < NV; ++i) cp_async16(buf + i * L + threadIdx.x, p + i * L * VEC);
    } else {
      const int lim = row_limit(r, cols, tq, diag, causal);
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int c0 = first + i * L * VEC;
        if (c0 < cols) cp_async16(buf + i * L + threadIdx.x, p + i * L * VEC, c0 < lim);
      }
    }
  }
  cp_async_commit();
}

// Where a persistent block works: C == 1, the whole row, rows blockIdx.x, + gridDim.x, ...; C > 1
// (a thread-block cluster of C CTAs per row), CTA `part` of the cluster takes the columns
// [part * SLICE, (part + 1) * SLICE) of rows cluster, + clusters, ...
template <int C, int SLICE>
__device__ __forceinline__ void persist_place(int64_t& first_row, int64_t& step, int& base) {
  if constexpr (C == 1) {
    first_row = blockIdx.x;
    step = gridDim.x;
    base = 0;
  } else {
    first_row = blockIdx.x / C;
    step = gridDim.x / C;
    base = (int)cg::this_cluster().block_rank() * SLICE;
  }
}

// Forward, persistent. MERGED: one (max, sum) reduction per row (exponentials against the warp's
// max, rescaled once), required for clusters (one exchange between the CTAs per row). PACKED: the
// row stays in registers as loaded (16-bit pairs: half the registers, so 64 elements per thread fit)
// and each kept element's exponential is computed twice, for the sum and for the output. The cluster
// exchange slots and the block reduction buffers alternate between rows, so the one barrier of the
// next row orders their reuse (the cluster exchange: see ClusterXchg).
// Blocks per SM to ask ptxas for: one, except packed rows on 512 threads, two (64 registers: a packed
// thread holds its row in half the registers), so two CTAs (two rows, or two cluster slices) share an
// SM and one's barrier or exchange overlaps the other's loads and stores (a sweep candidate).
constexpr int persist_min_blocks(int threads, bool packed) { return packed && threads <= 512 ? 2 : 1; }

template <typename T, int VEC, int NV, int L, int B, int C, bool MERGED, bool PACKED>
__global__ void __launch_bounds__(L, persist_min_blocks(L, PACKED))
    fwd_persist_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int cols, int64_t x_stride,
                       int64_t tq, int64_t diag, float c, bool causal) {
  extern __shared__ uint4 stage[];
  static_assert(L % 32 == 0 && L >= 64, "one row (slice) per block of whole warps");
  static_assert(C == 1 || MERGED, "a cluster merges (max, sum) in one exchange per row");
  __shared__ float red_max[MERGED ? 1 : 2][L / 32], red_sum[MERGED ? 1 : 2][L / 32];
  __shared__ float2 red_stats[MERGED ? 2 : 1][L / 32];
  __shared__ ClusterXchg<float2, C> xs;
  int64_t r, step;
  int base;
  persist_place<C, L * NV * VEC>(r, step, base);
  const unsigned rank = C > 1 ? cg::this_cluster().block_rank() : 0;
  if constexpr (C > 1) xchg_init(xs);
  const int first = base + threadIdx.x * VEC;  // vector i of this thread starts at column first + i * L * VEC
  const unsigned fill = fill_word<T>(c);
  const float sg = sign_of(c), a = fabsf(c);  // keys x * sign(c), exponents (key - ref) * |c| (see sign_of)
  // FULL (rows of exactly C * L * NV * VEC columns, not causal: every vector of every row unmasked) runs
  // a copy of the loop without the per-vector checks of prefetch, fill and store.
  auto run = [&](auto full) {
    constexpr bool FULL = decltype(full)::value;
    // The first row straight into registers (global loads) and the next B into the buffers: two rows'
    // loads in flight from the start, not one row's alone before any math or store can begin.
    uint4 w[NV];
    if (r < rows) {
      const T* p = x + r * x_stride + first;  // vector i at p + i * L * VEC
      const int lim = FULL ? cols : row_limit(r, cols, tq, diag, causal);
#pragma unroll
      for (int i = 0; i < NV; ++i)
        w[i] = FULL ? *reinterpret_cast<const uint4*>(p + i * L * VEC)
                    : load_vec<T, VEC>(p - first, first + i * L * VEC, lim);  // (p - first: the row start)
    }
#pragma unroll
    for (int b = 0; b < B; ++b)
      prefetch_row<T, VEC, NV, L, FULL>(stage + b * NV * L, x, r + (b + 1) * step, rows, cols, base, x_stride, tq,
                                        diag, causal);
    for (int k = 0; r < rows; ++k) {
      if constexpr (!FULL) mask_tail<T, VEC, NV, L>(w, first, row_limit(r, cols, tq, diag, causal), fill);
      const float m = max_key<T, NV>(w, c);
      float v[PACKED ? 1 : NV * VEC];  // unpacked: the exponentials, kept for the output
      auto exp_sum = [&](float ref) {
        if constexpr (PACKED)
          return packed_exp_sum<T, VEC, NV>(w, c, ref * sg);
        else
          return exp_words<T, VEC, NV>(v, w, c, ref * sg);
      };
      float ref, f;  // output = exp2((key - ref) * |c|) * f (unpacked: v * f)
      if constexpr (MERGED) {
        float M, S;
        ref = merged_stats<L>(m, exp_sum, red_stats[k & 1], M, S, a);
        if constexpr (C > 1) {
          float cm = -INFINITY, cs = 0.f;
          xchg(xs, rank, k, make_float2(M, S), [&](float2 o) { merge_stats(cm, cs, o.x, o.y, a); });
          M = cm;
          S = cs;
        }
        const float Mref = M == -INFINITY ? 0.f : M;
        const float inv = 1.f / (S == 0.f ? 1.f : S);  // NaN stays NaN
        if constexpr (PACKED) {
          ref = Mref;
          f = inv;
        } else {
          f = fast_exp2((ref - Mref) * a) * inv;
        }
      } else {
        const float M = row_max<L>(m, red_max[k & 1]);
        ref = M == -INFINITY ? 0.f : M;  // no unmasked key: every exponential is 0
        const float S = row_sum<L>(exp_sum(ref), red_sum[k & 1]);
        f = 1.f / (S == 0.f ? 1.f : S);
      }
      if constexpr (PACKED)
        store_exp<T, VEC, NV, L, FULL>(y + r * cols, w, first, cols, c, ref * sg, f);
      else
        store_scaled<T, VEC, NV, L, FULL>(y + r * cols, v, first, cols, f);
      r += step;
      if (r < rows) {  // the next row from its buffer (its group: the oldest of B in flight), and the row
                       // B steps after it into that buffer
        uint4* buf = stage + (k % B) * NV * L;
        cp_async_wait<B - 1>();
#pragma unroll
        for (int i = 0; i < NV; ++i) w[i] = buf[i * L + threadIdx.x];
        prefetch_row<T, VEC, NV, L, FULL>(buf, x, r + B * step, rows, cols, base, x_stride, tq, diag, causal);
      }
    }
  };
  if (!causal && cols == C * L * NV * VEC)
    run(std::true_type{});
  else
    run(std::false_type{});
  cp_async_wait<0>();  // nothing left in flight at exit
  if constexpr (C > 1) cg::this_cluster().sync();  // no CTA leaves while another may read its slots
}

// ---------------------------------------------------------------------------------------------
// hybrid path: a 16-bit row of up to L * (NV + NS) * VEC columns per block, NV vectors of each thread
// in registers (packed words) and NS in shared memory ([NS][L] x 16 bytes, dynamic), copied there by the
// thread itself with cp.async and read back only by it (no barrier for the staging). Two blocks share
// an SM (64 registers, L = 512), so one block's reduction overlaps the other's loads and stores, as two
// register rows per SM do for shorter rows. One pass over global memory each way.
// ---------------------------------------------------------------------------------------------
// mask_tail computed another way: a select for each vector wholly at or past lim, then fill_from for
// the one vector that straddles lim, if this thread has it (found by division, not by testing every
// vector). The same result; the hybrid kernel needs it to stay within 64 registers without spilling.
// Not the only form: with it, the 16-bit split forward (512 x 32 packed, capped at 32 registers) spills
// 12 bytes, and with mask_tail the hybrid kernel does, so each keeps the form that fits its cap.
template <typename T, int VEC, int NV, int L>
__device__ __forceinline__ void mask_tail_once(uint4* w, int first, int lim, unsigned fill) {
  const int d = lim - first;  // vector i lies wholly at or past lim iff i * L * VEC >= d
#pragma unroll
  for (int i = 0; i < NV; ++i)
    if (i * L * VEC >= d) w[i] = make_uint4(fill, fill, fill, fill);
  const int q = d / (L * VEC), k = d - q * (L * VEC);  // (d > 0: vector q holds lim iff 0 < k < VEC)
  if (d > 0 && q < NV && k > 0 && k < VEC) {
#pragma unroll
    for (int i = 0; i < NV; ++i)
      if (i == q) w[i] = fill_from<T>(w[i], k, fill);
  }
}

template <typename T, int VEC, int NV, int NS, int L>
__global__ void __launch_bounds__(L, 2)
    fwd_hybrid_kernel(const T* __restrict__ x, T* __restrict__ y, int cols, int64_t x_stride, int64_t tq,
                      int64_t diag, float c, bool causal) {
  extern __shared__ uint4 stage[];
  __shared__ float2 red_stats[L / 32];
  constexpr int K = 2;  // shared vectors in registers at a time
  static_assert(sizeof(T) == 2 && NS % K == 0 && L % 32 == 0 && L >= 64, "16-bit rows, whole warps");
  const int64_t row = blockIdx.x;
  const T* xr = x + row * x_stride;
  T* yr = y + row * cols;
  const int first = threadIdx.x * VEC;       // register vector i at column first + i * L * VEC
  const int sfirst = first + NV * L * VEC;   // shared vector i at column sfirst + i * L * VEC
  const unsigned fill = fill_word<T>(c);
  const float sg = sign_of(c), a = fabsf(c);
  // FULL (rows of exactly L * (NV + NS) * VEC columns, not causal): no per-vector checks or fill
  auto run = [&](auto full) {
    constexpr bool FULL = decltype(full)::value;
    const int lim = FULL ? cols : row_limit(row, cols, tq, diag, causal);
    // loads: the register part, then the shared part (the vectors of the unmasked prefix; all issued first)
    uint4 w[NV];
#pragma unroll
    for (int i = 0; i < NV; ++i)
      w[i] = FULL ? *reinterpret_cast<const uint4*>(xr + first + i * L * VEC)
                  : load_vec<T, VEC>(xr, first + i * L * VEC, lim);
#pragma unroll
    for (int i = 0; i < NS; ++i) {
      const int c0 = sfirst + i * L * VEC;
      if (FULL)
        cp_async16(stage + i * L + threadIdx.x, xr + c0);
      else  // (zeros at and past lim, nothing read: the row start as the address, inside the tensor)
        cp_async16(stage + i * L + threadIdx.x, xr + (c0 < lim ? c0 : 0), c0 < lim);
    }
    cp_async_commit();
    // shared vectors k * K ... k * K + K - 1
    auto shared = [&](uint4* s, int k) {
#pragma unroll
      for (int j = 0; j < K; ++j) s[j] = stage[(k * K + j) * L + threadIdx.x];
    };
    if constexpr (!FULL) mask_tail_once<T, VEC, NV, L>(w, first, lim, fill);
    float m = max_key<T, NV>(w, c);
    cp_async_wait<0>();
    if constexpr (!FULL) {  // the fill written over the staged copy at and past lim, once (vectors past
                            // the row were never copied)
#pragma unroll
      for (int i = 0; i < NS; ++i) {
        const int c0 = sfirst + i * L * VEC;
        if (c0 + VEC > lim) {
          uint4 v = stage[i * L + threadIdx.x];
          mask_tail<T, VEC, 1, L>(&v, c0, lim, fill);
          stage[i * L + threadIdx.x] = v;
        }
      }
    }
#pragma unroll
    for (int k = 0; k < NS / K; ++k) {
      uint4 s[K];
      shared(s, k);
      m = fmaxf(m, max_key<T, K>(s, c));
    }
    auto exp_sum = [&](float ref) {
      float e = packed_exp_sum<T, VEC, NV>(w, c, ref * sg);
#pragma unroll
      for (int k = 0; k < NS / K; ++k) {
        uint4 s[K];
        shared(s, k);
        e += packed_exp_sum<T, VEC, K>(s, c, ref * sg);
      }
      return e;
    };
    float M, S;
    merged_stats<L>(m, exp_sum, red_stats, M, S, a);
    const float ref = (M == -INFINITY ? 0.f : M) * sg;
    const float f = 1.f / (S == 0.f ? 1.f : S);  // NaN stays NaN
    store_exp<T, VEC, NV, L, FULL>(yr, w, first, cols, c, ref, f);
#pragma unroll
    for (int k = 0; k < NS / K; ++k) {
      uint4 s[K];
      shared(s, k);
      store_exp<T, VEC, K, L, FULL>(yr, s, sfirst + k * K * L * VEC, cols, c, ref, f);
    }
  };
  if (!causal && cols == L * (NV + NS) * VEC)
    run(std::true_type{});
  else
    run(std::false_type{});
}

// Backward, persistent: y and dy of the next B rows prefetched; C > 1 as above (one exchange of the
// row's dot product per row).
template <typename T, int VEC, int NV, int L, int B, int C>
__global__ void __launch_bounds__(L, 1)
    bwd_persist_kernel(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, int64_t rows,
                       int cols, int64_t dy_stride, int64_t tq, int64_t diag, float scale, bool causal) {
  extern __shared__ uint4 stage[];  // [B][2: y, dy][NV][L]
  __shared__ float red[2][L / 32];
  __shared__ ClusterXchg<float, C> xs;
  static_assert(L % 32 == 0 && L >= 64, "one row (slice) per block of whole warps");
  int64_t r, step;
  int base;
  persist_place<C, L * NV * VEC>(r, step, base);
  const unsigned rank = C > 1 ? cg::this_cluster().block_rank() : 0;
  if constexpr (C > 1) xchg_init(xs);
  const int first = base + threadIdx.x * VEC;
  auto prefetch = [&](uint4* buf, int64_t rr) {
    if (rr < rows) {
      const int lim = row_limit(rr, cols, tq, diag, causal);
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int c0 = first + i * L * VEC;
        if (c0 < cols) {
          cp_async16(buf + i * L + threadIdx.x, y + rr * cols + c0, c0 < lim);
          cp_async16(buf + (NV + i) * L + threadIdx.x, dy + rr * dy_stride + c0, c0 < lim);
        }
      }
    }
    cp_async_commit();
  };
#pragma unroll
  for (int b = 0; b < B; ++b) prefetch(stage + b * 2 * NV * L, r + b * step);
  for (int k = 0; r < rows; r += step, ++k) {
    uint4* buf = stage + (k % B) * 2 * NV * L;
    cp_async_wait<B - 1>();
    uint4 ya[NV], ga[NV];
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      ya[i] = buf[i * L + threadIdx.x];
      ga[i] = buf[(NV + i) * L + threadIdx.x];
    }
    prefetch(buf, r + B * step);
    const int lim = row_limit(r, cols, tq, diag, causal);
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int c0 = first + i * L * VEC;
#pragma unroll
      for (int j = 0; j < VEC; ++j)
        if (c0 + j < lim) dot += Words<T>::get(ya[i], j) * Words<T>::get(ga[i], j);
    }
    dot = row_sum<L>(dot, red[k & 1]);
    if constexpr (C > 1) {
      float total = 0.f;
      xchg(xs, rank, k, dot, [&](float o) { total += o; });
      dot = total;
    }
    store_dx<T, VEC, NV, L>(dx + r * cols, ya, ga, first, cols, lim, scale, dot);
  }
  cp_async_wait<0>();
  if constexpr (C > 1) cg::this_cluster().sync();
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

  // pass 1: online max (of the keys x * sign(c), see sign_of) and rescaled sum over this thread's chunks
  // maxima start at -FLT_MAX, not -inf: (m - ref) * |c| stays finite at scale 0 (no -inf * 0); a row
  // with no finite key keeps it, and its -inf keys still give exp2(-inf) = 0
  const float sg = sign_of(c), a = fabsf(c);
  float m = -FLT_MAX, s = 0.f;
#pragma unroll 4
  for (int c0 = threadIdx.x * VEC; c0 < lim; c0 += STEP) {
    const Pack<T, VEC> p = load_prefix<T, VEC>(xr, c0, lim);
    float mm = -FLT_MAX;
#pragma unroll
    for (int j = 0; j < VEC; ++j)
      if (c0 + j < lim) mm = fmaxf(mm, Cvt<T>::load(p.v[j]) * sg);
    const float ref = fmaxf(m, mm);
    float add = 0.f;
#pragma unroll
    for (int j = 0; j < VEC; ++j)
      if (c0 + j < lim) add += fast_exp2((Cvt<T>::load(p.v[j]) - ref * sg) * c);
    s = rescaled(s, m, ref, a) + add;
    m = ref;
  }
  row_stats<kStreamThreads>(m, s, red, a);
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
      o.v[j] = Cvt<T>::store(c0 + j < lim ? fast_exp2((Cvt<T>::load(p.v[j]) - m * sg) * c) * inv : 0.f);
    store_row<T, VEC>(yr, c0, cols, o);
  }
}

template <typename T, int VEC>
__global__ void __launch_bounds__(kStreamThreads)
    bwd_stream_kernel(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, int cols,
                      int64_t dy_stride, int64_t tq, int64_t diag, float scale, bool causal) {
  __shared__ float red[32];
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
// host-side launchers, shared by the production dispatch and the tuning variants
// ---------------------------------------------------------------------------------------------
template <typename T>
constexpr int vec_of() {
  return 16 / (int)sizeof(T);
}

struct Args {
  const void* a;  // x (forward) or y (backward)
  const void* b;  // dy (backward)
  void* out;
  int64_t rows, cols, stride, tq, diag;
  float scale;
  bool causal;
  cudaStream_t stream;
  void* workspace;  // split path only: split_workspace_bytes() bytes
};

// Register-path shape for rows of up to BLOCK_N columns with about ITEMS_WANT elements per thread
// (at least one 16-byte vector, at most the whole row): L threads per row; L <= 32 packs 256 / L rows
// into a block, L > 32 is one row per block (the block-wide reductions assume it).
template <typename T, int BLOCK_N, int ITEMS_WANT>
struct RegShape {
  static constexpr int VEC = vec_of<T>();
  static constexpr int ITEMS0 = ITEMS_WANT < VEC ? VEC : ITEMS_WANT;
  static constexpr int ITEMS = ITEMS0 > BLOCK_N ? BLOCK_N : ITEMS0;
  static constexpr int NV = ITEMS / VEC;
  static constexpr int L = BLOCK_N / ITEMS;
  static constexpr int ROWS = L > 32 ? 1 : 256 / L;
  static_assert(ITEMS % VEC == 0 && L * ITEMS == BLOCK_N && L * ROWS <= 1024, "bad register config");
};

template <typename T, int BLOCK_N, int ITEMS_WANT, bool MERGED, bool PACKED>
cudaError_t launch_fwd_register(const Args& a) {
  using C = RegShape<T, BLOCK_N, ITEMS_WANT>;
  const int64_t blocks = (a.rows + C::ROWS - 1) / C::ROWS;
  fwd_register_kernel<T, C::VEC, C::NV, C::L, C::ROWS, MERGED, PACKED && sizeof(T) == 2, kBlock>
      <<<(unsigned)blocks, C::L * C::ROWS, 0, a.stream>>>(static_cast<const T*>(a.a), static_cast<T*>(a.out),
                                                         a.rows, (int)a.cols, a.stride, a.tq, a.diag,
                                                         a.scale * kLog2e, a.causal, SplitWs{});
  return cudaGetLastError();
}

template <typename T, int BLOCK_N, int ITEMS_WANT, bool CAP>
cudaError_t launch_bwd_register(const Args& a) {
  using C = RegShape<T, BLOCK_N, ITEMS_WANT>;
  const int64_t blocks = (a.rows + C::ROWS - 1) / C::ROWS;
  bwd_register_kernel<T, C::VEC, C::NV, C::L, C::ROWS, kBlock, CAP><<<(unsigned)blocks, C::L * C::ROWS, 0, a.stream>>>(
      static_cast<const T*>(a.a), static_cast<const T*>(a.b), static_cast<T*>(a.out), a.rows, (int)a.cols,
      a.stride, a.tq, a.diag, a.scale, a.causal, SplitWs{});
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

// Columns one CTA of a cluster covers, and the CTAs a row needs.
inline int ctas_for(int64_t cols, int threads, int items) {
  return (int)((cols + (int64_t)threads * items - 1) / ((int64_t)threads * items));
}

// One row per cluster of ceil(cols / (threads * items)) CTAs.
template <typename Kernel, typename... KernelArgs>
cudaError_t launch_cluster(Kernel kernel, const Args& a, int threads, int items, KernelArgs... args) {
  const int n_ctas = ctas_for(a.cols, threads, items);
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t cfg = cluster_config(a, threads, n_ctas, attr);
  cudaError_t err = allow_cluster(kernel, n_ctas);
  if (err == cudaSuccess) err = cudaLaunchKernelEx(&cfg, kernel, args...);
  return err;
}

template <typename T, int L, int ITEMS, bool PACKED>
cudaError_t launch_fwd_cluster(const Args& a) {
  constexpr int VEC = vec_of<T>();
  static_assert(ITEMS % VEC == 0, "bad cluster config");
  return launch_cluster(fwd_register_kernel<T, VEC, ITEMS / VEC, L, 1, true, PACKED && sizeof(T) == 2, kCluster>,
                        a, L, ITEMS, static_cast<const T*>(a.a), static_cast<T*>(a.out), a.rows, (int)a.cols,
                        a.stride, a.tq, a.diag, a.scale * kLog2e, a.causal, SplitWs{});
}

template <typename T, int L, int ITEMS, bool CAP>
cudaError_t launch_bwd_cluster(const Args& a) {
  constexpr int VEC = vec_of<T>();
  static_assert(ITEMS % VEC == 0, "bad cluster config");
  return launch_cluster(bwd_register_kernel<T, VEC, ITEMS / VEC, L, 1, kCluster, CAP>, a, L, ITEMS,
                        static_cast<const T*>(a.a), static_cast<const T*>(a.b), static_cast<T*>(a.out), a.rows,
                        (int)a.cols, a.stride, a.tq, a.diag, a.scale, a.causal, SplitWs{});
}

// Split path: rows of up to kMaxSplits slices of L threads x ITEMS elements; the workspace holds the
// counters (zeroed here, on the stream) and the partials.
constexpr int kMaxSplits = 128;

inline int64_t split_counter_bytes(int64_t rows) { return ((rows + 1) * 4 + 15) / 16 * 16; }

inline int64_t split_workspace_bytes(int64_t rows, int64_t cols, int threads, int items) {
  return split_counter_bytes(rows) + rows * ctas_for(cols, threads, items) * (int64_t)sizeof(float2);
}

inline bool split_fits(int64_t rows, int64_t cols, int threads, int items) {
  const int64_t n = ctas_for(cols, threads, items);
  return n >= 1 && n <= kMaxSplits && rows * n < 0x7fffffff;
}

template <typename Kernel, typename... KernelArgs>
cudaError_t launch_split(Kernel kernel, const Args& a, int threads, int items, KernelArgs... args) {
  if (!split_fits(a.rows, a.cols, threads, items) || a.workspace == nullptr) return cudaErrorInvalidValue;
  const int splits = ctas_for(a.cols, threads, items);
  char* ws = static_cast<char*>(a.workspace);
  cudaError_t err = cudaMemsetAsync(ws, 0, (size_t)split_counter_bytes(a.rows), a.stream);
  if (err != cudaSuccess) return err;
  const SplitWs w{reinterpret_cast<unsigned*>(ws), reinterpret_cast<float2*>(ws + split_counter_bytes(a.rows)), splits};
  kernel<<<(unsigned)(a.rows * splits), threads, 0, a.stream>>>(args..., w);
  return cudaGetLastError();
}

template <typename T, int L, int ITEMS, bool PACKED>
cudaError_t launch_fwd_split(const Args& a) {
  constexpr int VEC = vec_of<T>();
  static_assert(ITEMS % VEC == 0, "bad split config");
  return launch_split(fwd_register_kernel<T, VEC, ITEMS / VEC, L, 1, true, PACKED && sizeof(T) == 2, kSplit>, a, L,
                      ITEMS, static_cast<const T*>(a.a), static_cast<T*>(a.out), a.rows, (int)a.cols, a.stride,
                      a.tq, a.diag, a.scale * kLog2e, a.causal);
}

template <typename T, int L, int ITEMS, bool CAP>
cudaError_t launch_bwd_split(const Args& a) {
  constexpr int VEC = vec_of<T>();
  static_assert(ITEMS % VEC == 0, "bad split config");
  return launch_split(bwd_register_kernel<T, VEC, ITEMS / VEC, L, 1, kSplit, CAP>, a, L, ITEMS,
                      static_cast<const T*>(a.a), static_cast<const T*>(a.b), static_cast<T*>(a.out), a.rows,
                      (int)a.cols, a.stride, a.tq, a.diag, a.scale, a.causal);
}

// Persistent path: rows of up to C * L * ITEMS columns (C CTAs per row: a thread-block cluster when
// C > 1), B row buffers of shared memory, as many blocks (clusters) as fit on the GPU at once, or one
// per row when there are fewer rows. What fits is asked once per kernel and device (the shared-memory
// opt-in, SM count and occupancy queries are host calls) and kept in the launcher's `resident` table,
// counted in blocks for C == 1 and in clusters otherwise.
constexpr int kMaxDevices = 64;

inline cudaLaunchConfig_t persist_config(int64_t blocks, int threads, size_t smem, int n_ctas, cudaStream_t stream,
                                         cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)blocks);
  cfg.blockDim = dim3((unsigned)threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = (unsigned)n_ctas;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = n_ctas > 1 ? 1 : 0;
  return cfg;
}

template <typename Kernel>
cudaError_t persist_grid(Kernel kernel, int threads, size_t smem, int n_ctas, int64_t rows, std::atomic<int>* resident,
                         int64_t* grid) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  int fit = dev < kMaxDevices ? resident[dev].load(std::memory_order_relaxed) : 0;
  if (fit == 0) {
    int sms = 0, per_sm = 0;
    err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (err == cudaSuccess)  // (always: with the static shared memory, even < 48 KB dynamic may need it)
      err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err == cudaSuccess) err = allow_cluster(kernel, n_ctas);
    if (err == cudaSuccess) {
      if (n_ctas == 1) {
        err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem);
        fit = sms * per_sm;
      } else {
        cudaLaunchAttribute attr[1];
        const cudaLaunchConfig_t cfg = persist_config((int64_t)sms / n_ctas * n_ctas, threads, smem, n_ctas, nullptr, attr);
        err = cudaOccupancyMaxActiveClusters(&fit, kernel, &cfg);
      }
    }
    if (err != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky: clear it, so the caller's next CUDA call does not report it
      return err;
    }
    if (fit < 1) return cudaErrorInvalidConfiguration;
    if (dev < kMaxDevices) resident[dev].store(fit, std::memory_order_relaxed);
  }
  *grid = (rows < (int64_t)fit ? rows : (int64_t)fit) * n_ctas;
  return cudaSuccess;
}

template <typename Kernel, typename... KernelArgs>
cudaError_t launch_persist(Kernel kernel, const Args& a, int threads, size_t smem, int n_ctas,
                           std::atomic<int>* resident, KernelArgs... args) {
  int64_t grid = 0;
  cudaError_t err = persist_grid(kernel, threads, smem, n_ctas, a.rows, resident, &grid);
  if (err != cudaSuccess) return err;
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t cfg = persist_config(grid, threads, smem, n_ctas, a.stream, attr);
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}

template <typename T, int L, int ITEMS, int B, int C = 1, bool MERGED = false, bool PACKED = false>
cudaError_t launch_fwd_persist(const Args& a) {
  constexpr int VEC = vec_of<T>(), NV = ITEMS / VEC;
  static_assert(ITEMS % VEC == 0, "bad persist config");
  if (a.cols > (int64_t)C * L * ITEMS) return cudaErrorInvalidValue;
  static std::atomic<int> resident[kMaxDevices];
  return launch_persist(fwd_persist_kernel<T, VEC, NV, L, B, C, MERGED, PACKED && sizeof(T) == 2>, a, L,
                        (size_t)B * NV * L * 16, C, resident, static_cast<const T*>(a.a), static_cast<T*>(a.out),
                        a.rows, (int)a.cols, a.stride, a.tq, a.diag, a.scale * kLog2e, a.causal);
}

// Hybrid path (forward, 16-bit): RI elements per thread in registers and SI in shared memory, a block
// per row; the shared-memory opt-in asked once per device.
template <typename T, int L, int RI, int SI>
cudaError_t launch_fwd_hybrid(const Args& a) {
  constexpr int VEC = vec_of<T>();
  static_assert(RI % VEC == 0 && SI % VEC == 0, "bad hybrid config");
  if (a.cols <= (int64_t)L * RI || a.cols > (int64_t)L * (RI + SI) || a.rows > INT32_MAX) return cudaErrorInvalidValue;
  auto kernel = fwd_hybrid_kernel<T, VEC, RI / VEC, SI / VEC, L>;
  const size_t smem = (size_t)SI / VEC * L * 16;
  static std::atomic<int> opted[kMaxDevices];
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev >= kMaxDevices || !opted[dev].load(std::memory_order_relaxed)) {
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess) return err;
    if (dev < kMaxDevices) opted[dev].store(1, std::memory_order_relaxed);
  }
  kernel<<<(unsigned)a.rows, L, smem, a.stream>>>(static_cast<const T*>(a.a), static_cast<T*>(a.out), (int)a.cols,
                                                  a.stride, a.tq, a.diag, a.scale * kLog2e, a.causal);
  return cudaGetLastError();
}

template <typename T, int L, int ITEMS, int B, int C = 1>
cudaError_t launch_bwd_persist(const Args& a) {
  constexpr int VEC = vec_of<T>(), NV = ITEMS / VEC;
  static_assert(ITEMS % VEC == 0, "bad persist config");
  if (a.cols > (int64_t)C * L * ITEMS) return cudaErrorInvalidValue;
  static std::atomic<int> resident[kMaxDevices];
  return launch_persist(bwd_persist_kernel<T, VEC, NV, L, B, C>, a, L, (size_t)B * 2 * NV * L * 16, C, resident,
                        static_cast<const T*>(a.a), static_cast<const T*>(a.b), static_cast<T*>(a.out), a.rows,
                        (int)a.cols, a.stride, a.tq, a.diag, a.scale, a.causal);
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

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <typename T>
bool is_aligned(const Args& a, bool backward) {
  constexpr int VEC = vec_of<T>();
  bool ok = a.cols % VEC == 0 && a.stride % VEC == 0 && aligned16(a.a) && aligned16(a.out);
  if (backward) ok = ok && aligned16(a.b);
  return ok;
}

inline int next_pow2_at_least(int64_t n, int lo) {
  int b = lo;
  while (b < n) b <<= 1;
  return b;
}

}  // namespace detail
}  // namespace softmax_harness
