// The on-chip cross-entropy kernel (device code; the code paths: paths.cuh): a row (or, SPLIT, a slice
// of it) in registers (NR 16-byte vectors per thread) and, for the hybrid path, NSV more vectors per
// thread in shared memory; L threads per row (slice), ROWS rows per block when L <= 32.
#pragma once

#include "common.cuh"

namespace softmax_harness {
namespace ce {

// Registers per thread to cap the kernel at (__launch_bounds__ below): hybrid 64 (two 512-thread blocks
// per SM); else what the row data needs (packed: the loaded words, NR * 4; unpacked: the fp32
// exponentials, NR * VEC) plus about 28 (packed) or 36 (unpacked) for the rest, rounded up to 32, 64, 80,
// 128 or 255 (each checked with -Xptxas -v: no spills; tests/test_cuda_build.py).
constexpr int ce_reg_cap(int nr, int nsv, bool packed, int vec) {
  if (nsv > 0) return 64;
  const int need = packed ? nr * 4 + 28 : nr * vec + 36;
  return need <= 32 ? 32 : need <= 64 ? 64 : need <= 80 ? 80 : need <= 128 ? 128 : 255;
}
constexpr int ce_min_blocks(int threads, int nr, int nsv, bool packed, int vec) {
#ifdef CE_NO_REG_CAP
  return 1;
#endif
  const int b = 65536 / (threads * ce_reg_cap(nr, nsv, packed, vec));
  return b < 1 ? 1 : (b > 32 ? 32 : b);
}

// The passes over the staged vectors (max, sum, stores) take SU vectors at a time: fully unrolled, ptxas
// hoists every shared-memory read of a pass and the 64-register hybrid kernel spills.
#ifndef CE_SHARED_UNROLL
#define CE_SHARED_UNROLL 2
#endif

// Register / hybrid / split kernel. Thread `lane` of a row holds the vectors at columns
// first + i * L * VEC, first = base + lane * VEC, for i < NR in registers and NR <= i < NR + NSV in
// shared memory ([NSV][L] x 16 bytes, dynamic); base = 0 (whole rows) or part * slice (SPLIT).
// Requires cols and slice multiples of VEC and 16-byte aligned rows (the host checks).
template <typename T, int VEC, int NR, int NSV, int L, int ROWS, bool PACKED, bool SPLIT>
__global__ void __launch_bounds__(L* ROWS, ce_min_blocks(L * ROWS, NR, NSV, PACKED, VEC))
    ce_rows_kernel(CeParams p, SplitWs ws) {
  static_assert(NR >= 1 && L * ROWS <= 1024 && (ROWS == 1 || L <= 32), "bad shape");
  static_assert(NSV == 0 || (PACKED && ROWS == 1 && L >= 64), "shared vectors: packed, a block per row");
  static_assert(!SPLIT || (ROWS == 1 && L >= 32), "split slices: a block per slice");
  constexpr int STEP = L * VEC;   // columns between a thread's consecutive vectors
  constexpr int SU = CE_SHARED_UNROLL;  // staged vectors per step of the passes over them (see below)
  constexpr float c = kLog2e;
  extern __shared__ uint4 stage[];  // NSV > 0: [NSV][L]
  __shared__ float2 red[L > 32 ? L / 32 : 1];
  __shared__ float2 bcast;
  const int lane = threadIdx.x % L;

  // which row, and which slice of it
  int64_t row;
  int base = 0, part = 0;
  if constexpr (SPLIT) {
    __shared__ unsigned ticket;
    if (threadIdx.x == 0) ticket = atomicAdd(ws.cnt, 1u);
    __syncthreads();
    row = ticket / (unsigned)ws.splits;
    part = (int)(ticket % (unsigned)ws.splits);
    base = part * p.slice;
  } else {
    row = (int64_t)blockIdx.x * ROWS + threadIdx.x / L;
  }
  const bool row_ok = row < p.rows;
  const int end = SPLIT ? min(base + p.slice, p.cols) : p.cols;  // this block's columns: [base, end)
  const T* xr = static_cast<const T*>(p.x) + (row_ok ? row : 0) * p.xs;
  const int first = base + lane * VEC;
  const int sfirst = first + NR * STEP;  // shared vector k at column sfirst + k * STEP

  // loads: all issued before the first is used, and before the target is known (an ignored row is read
  // too: its loads need not wait for the target's); predicated, zeros past end
  uint4 w[NR];
#pragma unroll
  for (int i = 0; i < NR; ++i) w[i] = detail::load_vec<T, VEC>(xr, first + i * STEP, end);
  if constexpr (NSV > 0) {
#pragma unroll
    for (int k = 0; k < NSV; ++k) {
      const int c0 = sfirst + k * STEP;
      detail::cp_async16(stage + k * L + threadIdx.x, xr + (c0 < end ? c0 : 0), c0 < end);
    }
    detail::cp_async_commit();
  }
  const RowTarget rt = row_target(p, row, row_ok);

  // vectors past end read as -inf (whole vectors: cols and slice are multiples of VEC)
  const unsigned fill = detail::fill_word<T>(1.f);
  const uint4 fill4 = make_uint4(fill, fill, fill, fill);
#pragma unroll
  for (int i = 0; i < NR; ++i)
    if (first + i * STEP >= end) w[i] = fill4;
  if constexpr (NSV > 0) {
    detail::cp_async_wait<0>();
#pragma unroll
    for (int k = 0; k < NSV; ++k)
      if (sfirst + k * STEP >= end) stage[k * L + threadIdx.x] = fill4;  // over the staged zeros, once
  }

  // the target: its owner (the thread whose vectors hold it) writes the loss and rewrites the target's
  // gradient element. It reads the target logit now (in place: before its own store of that element,
  // program order; no other thread writes it) and parks it in shared memory until the end, where it
  // finds itself again from the target (reloaded): nothing of the target is live across the reduction.
  auto owned = [&](int64_t t) {  // the target's column - first, if this thread owns it, else -1
    const int d = rt.live && t >= first && t < end ? (int)t - first : -1;  // (t >= first >= base)
    return d >= 0 && d % STEP < VEC && d / STEP < NR + NSV ? d : -1;
  };
  __shared__ float s_xt[ROWS];  // written and read by the owner only
  {
    const int tq = owned(rt.t);
    if (tq >= 0) s_xt[threadIdx.x / L] = Cvt<T>::load(xr[first + tq]);
  }

  // statistics: this thread's exponentials against its warp's max, one merge over the row (and, SPLIT,
  // over the row's slices through the workspace)
  float m = detail::max_key<T, NR>(w, 1.f);
#pragma unroll SU
  for (int j = 0; j < NSV; ++j) {
    const uint4 sv = stage[j * L + threadIdx.x];
    m = fmaxf(m, detail::max_key<T, 1>(&sv, 1.f));
  }
  float v[PACKED ? 1 : NR * VEC];  // unpacked: the exponentials, kept for the gradient
  auto exp_sum = [&](float ref) {
    float s;
    if constexpr (PACKED)
      s = detail::packed_exp_sum<T, VEC, NR>(w, c, ref);
    else
      s = detail::exp_words<T, VEC, NR>(v, w, c, ref);
#pragma unroll SU
    for (int j = 0; j < NSV; ++j) {
      const uint4 sv = stage[j * L + threadIdx.x];
      s += detail::packed_exp_sum<T, VEC, 1>(&sv, c, ref);
    }
    return s;
  };
  float M, S;
  const float wm = ce_stats<L>(m, exp_sum, red, M, S);
  if constexpr (SPLIT) detail::split_stats(M, S, ws, row, part, &bcast, c);
  const float ref = wm == -INFINITY ? 0.f : wm;
  const float gsc = p.scale != nullptr && rt.live ? __ldg(p.scale + row * p.scale_stride) : 1.f;
  const float fs = prob_scale(wm, M, S) * gsc;  // gradient = exponential * fs - [target] * gsc

  // an ignored or bad row's loss: lane 0 of part 0
  if (row_ok && !rt.live && part == 0 && lane == 0) {
    p.loss[row] = rt.bad ? quiet_nan() : 0.f;
    if (rt.bad) record_bad_target(p.err, row, __ldg(p.tgt + row), p.cols);  // (reloaded: t not kept live)
  }

  // gradient: e * fs everywhere (the owner rewrites the target's element below, after its own store of
  // it: program order); an ignored row's zeros, a bad row's NaN
  T* gr = static_cast<T*>(p.g) + (row_ok ? row : 0) * p.gs;
  if (p.g != nullptr && row_ok) {
    if (!rt.live) {
      const float z = rt.bad ? quiet_nan() : 0.f;
      detail::store_vectors<T, VEC, NR, L>(gr, first, end, [&](int, int) { return z; });
#pragma unroll
      for (int k = 0; k < NSV; ++k)
        detail::store_vectors<T, VEC, 1, L>(gr, sfirst + k * STEP, end, [&](int, int) { return z; });
    } else {
      if constexpr (PACKED)
        detail::store_vectors<T, VEC, NR, L>(gr, first, end, [&](int i, int j) {
          return detail::fast_exp2((Words<T>::get_again(w[i], j) - ref) * c) * fs;
        });
      else
        detail::store_vectors<T, VEC, NR, L>(gr, first, end, [&](int i, int j) { return v[i * VEC + j] * fs; });
#pragma unroll SU
      for (int k = 0; k < NSV; ++k) {
        const uint4 sv = stage[k * L + threadIdx.x];
        detail::store_vectors<T, VEC, 1, L>(gr, sfirst + k * STEP, end, [&](int, int j) {
          return detail::fast_exp2((Words<T>::get_again(sv, j) - ref) * c) * fs;
        });
      }
    }
  }

  // the owner: the loss and the target's gradient element
  const int tq = rt.live ? owned(__ldg(p.tgt + row)) : -1;
  if (tq >= 0) {
    const float xt = s_xt[threadIdx.x / L];
    p.loss[row] = row_loss(M, S, xt);
    if (p.g != nullptr) gr[first + tq] = Cvt<T>::store(fmaf(detail::fast_exp2((xt - ref) * c), fs, -gsc));
  }
}

}  // namespace ce
}  // namespace softmax_harness
