// The persistent path (device code; the code paths: paths.cuh), forward and backward: blocks loop over
// rows (rows blockIdx.x, + gridDim.x, ... for one CTA per row; C > 1: a row over a cluster of C CTAs,
// see persist_place), B shared-memory buffers of one row's vectors each ([B][NV][L] x 16 bytes, dynamic
// shared memory).
#pragma once

#include "cluster.cuh"
#include "common.cuh"

namespace softmax_harness {
namespace detail {

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
          f = fast_exp2(fminf((ref - Mref) * a, 0.f)) * inv;  // clamped: see register.cuh (all-masked warp)
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
    float dot = row_sum<L>(masked_dot<T, VEC, NV, L>(ya, ga, first, lim), red[k & 1]);
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

}  // namespace detail
}  // namespace softmax_harness
