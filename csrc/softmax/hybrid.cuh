// The hybrid path (device code; the code paths: paths.cuh): a 16-bit row of up to L * (NV + NS) * VEC
// columns per block, NV vectors of each thread in registers (packed words) and NS in shared memory
// ([NS][L] x 16 bytes, dynamic), copied there by the thread itself with cp.async and read back only by
// it (no barrier for the staging). Two blocks share an SM (64 registers, L = 512), so one block's
// reduction overlaps the other's loads and stores, as two register rows per SM do for shorter rows. One
// pass over global memory each way.
#pragma once

#include "common.cuh"

namespace softmax_harness {
namespace detail {

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

}  // namespace detail
}  // namespace softmax_harness
