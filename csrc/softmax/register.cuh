// The register kernels (device code; the code paths: paths.cuh): a row in registers, several short
// rows per warp or a block per row (SPAN = kBlock), and, with the same kernels, a row over a
// thread-block cluster (SPAN = kCluster: the cluster path) or over ordinary blocks meeting in global
// memory (SPAN = kSplit: the split path).
#pragma once

#include "cluster.cuh"
#include "common.cuh"
#include "split.cuh"

namespace softmax_harness {
namespace detail {

// Which row, and which slice of it, this thread works on. Register path: ROWS rows per block, L
// threads per row, the whole row. Cluster path: one row per cluster; CTA r of the cluster takes the
// columns [r * SLICE, (r + 1) * SLICE). Split path: the same slices, by ticket (see paths.cuh).
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

// Blocks per SM to ask ptxas for (__launch_bounds__): enough to cap the registers near what the row
// data a thread holds needs (REGS 32-bit registers of it, in NV 16-byte vectors): 32 registers for up
// to 16 data registers in at most two vectors (or up to 16 held as packed words), 64 up to 32, else no
// cap. So big blocks do not run one per SM, where a block-wide barrier stalls the SM's memory stream.
constexpr int min_blocks(int threads, int regs, int nv, bool packed) {
  const int cap = regs <= 16 && (nv <= 2 || packed) ? 32 : regs <= 32 ? 64 : 255;
  const int b = 65536 / (threads * cap);
  return b < 1 ? 1 : (b > 32 ? 32 : b);
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
    // a warp with nothing unmasked took ref = 0, above Mref when every kept key is negative: its
    // exponent, clamped at 0, keeps f finite (its outputs are 0, not 0 x inf = NaN); any other warp's
    // ref is at most Mref, unchanged. NaN stays NaN (through S).
    f = fast_exp2(fminf((ref - Mref) * fabsf(c), 0.f)) / (S == 0.f ? 1.f : S);
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
  float dot = row_sum<L>(masked_dot<T, VEC, NV, L>(ya, ga, first, lim), red);
  if constexpr (CLUSTER) {
    float total = 0.f;
    cluster_xchg(cslots, n_ctas, (unsigned)part, dot, [&](float o) { total += o; });
    dot = total;
  }
  if constexpr (SPLIT) dot = split_sum(dot, ws, row, part, &slot);
  if (row_ok) store_dx<T, VEC, NV, L>(dx + row * cols, ya, ga, first, cols, lim, scale, dot);
  if constexpr (CLUSTER) cluster_end();
}

}  // namespace detail
}  // namespace softmax_harness
