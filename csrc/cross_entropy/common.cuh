// What the cross-entropy code paths share (device code; the code paths are listed in paths.cuh): the
// launch arguments, a row's target, the error record of out-of-range targets, the merged row statistics.
// Vector loads, conversions and reductions come from the softmax kernels (softmax/common.cuh), the split
// path's exchange through global memory from softmax/split.cuh.
#pragma once

#include "../softmax/common.cuh"
#include "../softmax/split.cuh"

namespace softmax_harness {
namespace ce {

using detail::Cvt;
using detail::kLog2e;
using detail::Pack;
using detail::SplitWs;
using detail::Words;

// One launch's arguments (device pointers; strides in elements). x and g are not __restrict__: g may be
// x (the gradient written in place of the logits).
struct CeParams {
  const void* x;             // logits (rows, cols): element (r, c) at x + r * xs + c
  void* g;                   // gradient (rows, cols) at g + r * gs + c, or nullptr (losses only)
  float* loss;               // (rows,)
  const int64_t* tgt;        // (rows,)
  const float* scale;        // gradient scale: nullptr (1), one (scale_stride 0) or one per row (1)
  unsigned long long* err;   // [first bad row + 1, its target, cols] (0 in the first word: none yet)
  int64_t rows, xs, gs, ignore, scale_stride;
  int cols;
  int slice;                 // columns per block of a row (split path), a multiple of the vector width
};

// A row's target: `live` rows have a target in [0, cols) (their loss and gradient are computed); an
// ignored row gets loss 0 and a zero gradient; a `bad` row (outside [0, cols), not ignore_index) gets
// NaN for both and is recorded.
struct RowTarget {
  int64_t t;
  bool live, bad;
};

__device__ __forceinline__ RowTarget row_target(const CeParams& p, int64_t row, bool row_ok) {
  RowTarget r;
  r.t = row_ok ? __ldg(p.tgt + row) : p.ignore;
  const bool valid = row_ok && r.t != p.ignore;
  r.bad = valid && (r.t < 0 || r.t >= p.cols);
  r.live = valid && !r.bad;
  return r;
}

__device__ __forceinline__ float quiet_nan() { return __int_as_float(0x7fffffff); }

// The first out-of-range target wins the record (row + 1, target, cols); the host reads it on request.
__device__ __forceinline__ void record_bad_target(unsigned long long* err, int64_t row, int64_t t, int cols) {
  if (err == nullptr) return;
  if (atomicCAS(err, 0ull, (unsigned long long)(row + 1)) == 0ull) {
    err[1] = (unsigned long long)t;
    err[2] = (unsigned long long)cols;
  }
}

// The loss of a row from its statistics: M the max, S the sum of exp2((x - M) * log2 e), xt the target
// logit: logsumexp - xt = (M - xt) + ln S (M - xt first: exact at any magnitude when xt is the max).
__device__ __forceinline__ float row_loss(float M, float S, float xt) { return (M - xt) + logf(S); }

// One-pass statistics of a row (merged_stats of softmax/common.cuh, c = log2 e > 0), returning the
// warp's max wm itself (-inf when the warp holds nothing but -inf): this thread's exponentials are taken
// against ref = (wm == -inf ? 0 : wm); M, S: the row's max and sum of exp2((x - M) * c). The scale that
// turns this thread's exponentials into probabilities is then step(wm, M, S) below, 0 for a warp with
// nothing but -inf (its exponentials are all 0: no 0 * inf when the row max is very negative).
template <int L, typename ExpSum>
__device__ __forceinline__ float ce_stats(float m, ExpSum&& exp_sum, float2* red, float& M, float& S) {
  constexpr int W = L < 32 ? L : 32;
  m = detail::warp_max<W>(m);
  const float s = detail::warp_sum<W>(exp_sum(m == -INFINITY ? 0.f : m));
  M = m;
  S = s;
  if constexpr (L > 32) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) red[warp] = make_float2(m, s);
    __syncthreads();
    const float2 q = lane < L / 32 ? red[lane] : make_float2(-INFINITY, 0.f);
    M = detail::warp_max<32>(q.x);
    S = detail::warp_sum<32>(detail::rescaled(q.y, q.x, M == -INFINITY ? 0.f : M, kLog2e));
  }
  return m;
}

// Probability of an element = its exponential (against ref, see ce_stats) times this.
__device__ __forceinline__ float prob_scale(float wm, float M, float S) {
  if (wm == -INFINITY) return 0.f;
  return detail::fast_exp2((wm - M) * kLog2e) / (S == 0.f ? 1.f : S);  // wm <= M; NaN stays NaN
}

}  // namespace ce
}  // namespace softmax_harness
