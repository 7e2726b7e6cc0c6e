// The stream path (device code; the code paths: paths.cuh): a block per row, two passes over global
// memory; rows of any length or alignment, any scale.
#pragma once

#include "common.cuh"

namespace softmax_harness {
namespace detail {

constexpr int kStreamThreads = 512;

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

}  // namespace detail
}  // namespace softmax_harness
