// The cross-entropy stream path (device code; the code paths: paths.cuh): a block of THREADS per row, any
// length or alignment (VEC = 1: element loads), two passes over the row.
#pragma once

#include "common.cuh"

namespace softmax_harness {
namespace ce {

template <typename T, int VEC, int THREADS>
__global__ void __launch_bounds__(THREADS) ce_stream_kernel(CeParams p) {
  static_assert(THREADS > 32 && THREADS % 32 == 0 && THREADS <= 1024, "whole warps, a block-wide barrier");
  __shared__ float2 red[32];
  constexpr int STEP = THREADS * VEC;
  constexpr float c = kLog2e;
  const int64_t row = blockIdx.x;
  const int cols = p.cols;
  const RowTarget rt = row_target(p, row, true);
  const T* xr = static_cast<const T*>(p.x) + row * p.xs;
  T* gr = p.g != nullptr ? static_cast<T*>(p.g) + row * p.gs : nullptr;
  const int first = threadIdx.x * VEC;

  if (!rt.live) {  // (uniform over the block) loss 0 and zeros, or NaN for a bad target; nothing read
    if (threadIdx.x == 0) {
      p.loss[row] = rt.bad ? quiet_nan() : 0.f;
      if (rt.bad) record_bad_target(p.err, row, rt.t, cols);
    }
    if (gr != nullptr) {
      Pack<T, VEC> z;
#pragma unroll
      for (int j = 0; j < VEC; ++j) z.v[j] = Cvt<T>::store(rt.bad ? quiet_nan() : 0.f);
      for (int c0 = first; c0 < cols; c0 += STEP) detail::store_row<T, VEC>(gr, c0, cols, z);
    }
    return;
  }
  // the target logit, read before the barrier in row_stats: in place, its gradient is written after it
  const float xt = threadIdx.x == 0 ? Cvt<T>::load(xr[rt.t]) : 0.f;
  const float gsc = p.scale != nullptr ? __ldg(p.scale + row * p.scale_stride) : 1.f;

  // pass 1: online max and sum of exp2((x - max) * c) over this thread's chunks
  float m = -INFINITY, s = 0.f;
#pragma unroll 4
  for (int c0 = first; c0 < cols; c0 += STEP) {
    const Pack<T, VEC> v = detail::load_prefix<T, VEC>(xr, c0, cols);
    float mm = -INFINITY;
#pragma unroll
    for (int j = 0; j < VEC; ++j)
      if (c0 + j < cols) mm = fmaxf(mm, Cvt<T>::load(v.v[j]));
    const float nm = fmaxf(m, mm);
    const float r = nm == -INFINITY ? 0.f : nm;
    float add = 0.f;
#pragma unroll
    for (int j = 0; j < VEC; ++j)
      if (c0 + j < cols) add += detail::fast_exp2((Cvt<T>::load(v.v[j]) - r) * c);
    s = s * detail::fast_exp2((m - r) * c) + add;  // (m = -inf: s = 0 stays 0; NaN stays NaN)
    m = nm;
  }
  detail::row_stats<THREADS>(m, s, red, c);  // every thread: the row's (max, sum); one barrier
  if (threadIdx.x == 0) p.loss[row] = row_loss(m, s, xt);
  if (gr == nullptr || first >= cols) return;

  // pass 2, over this thread's chunks backwards (the most recently read first)
  const float mr = m == -INFINITY ? 0.f : m;
  const float fs = gsc / (s == 0.f ? 1.f : s);
  for (int k = (cols - 1 - first) / STEP; k >= 0; --k) {
    const int c0 = first + k * STEP;
    const Pack<T, VEC> v = detail::load_prefix<T, VEC>(xr, c0, cols);
    Pack<T, VEC> o;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float e = detail::fast_exp2((Cvt<T>::load(v.v[j]) - mr) * c);
      o.v[j] = Cvt<T>::store(c0 + j == rt.t ? fmaf(e, fs, -gsc) : e * fs);
    }
    detail::store_row<T, VEC>(gr, c0, cols, o);
  }
}

}  // namespace ce
}  // namespace softmax_harness
