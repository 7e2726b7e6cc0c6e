// The launch variants behind the table in cross_entropy_kernels.cu (see cross_entropy_tuning.h): the
// register and stream paths (the hybrid and split variants: cross_entropy_tuning_split.cu).
#include "cross_entropy_tuning.h"

#include "cross_entropy/launch.cuh"
#include "softmax_tuning.h"  // tuning::with_int, with_bool

namespace softmax_harness {

namespace ce_tuning {
using T = __nv_bfloat16;

inline ce::CeParams params(const void* x, void* g, float* loss, const int64_t* targets, const float* scale,
                           int64_t rows, int64_t cols) {
  ce::CeParams p{};
  p.x = x;
  p.g = g;
  p.loss = loss;
  p.tgt = targets;
  p.scale = scale;
  p.err = nullptr;  // (the sweep's targets are in range)
  p.rows = rows;
  p.xs = cols;
  p.gs = cols;
  p.ignore = -100;
  p.scale_stride = 0;
  p.cols = (int)cols;
  p.slice = (int)cols;
  return p;
}
}  // namespace ce_tuning

#define V(x) std::decay_t<decltype(x)>::value

int64_t ce_tuned_workspace_bytes(int64_t rows) { return ce::split_workspace_bytes(rows, ce::kMaxSplits); }

cudaError_t ce_tuned(const void* x, void* g, float* loss, const int64_t* targets, const float* scale, int64_t rows,
                     int64_t cols, int path, int threads, int items, int smem_items, bool packed, void* workspace,
                     cudaStream_t stream) {
  using ce_tuning::T;
  using tuning::with_bool;
  using tuning::with_int;
  if (rows <= 0 || cols <= 0 || cols % 8 != 0 || cols > 0x7fffffff || !ce::aligned16(x) || !ce::aligned16(g))
    return cudaErrorNotSupported;
  if (path == 1 || path == 2)
    return ce_tuned_split(x, g, loss, targets, scale, rows, cols, path, threads, items, smem_items, packed, workspace,
                          stream);
  const ce::CeParams p = ce_tuning::params(x, g, loss, targets, scale, rows, cols);
  if (path == 3)
    return with_int<256, 512, 1024>(threads, [&](auto l) { return ce::launch_stream<T, 8, V(l)>(p, stream); });
  if (path != 0 || smem_items != 0) return cudaErrorNotSupported;
  return with_int<4096, 8192, 16384, 32768, 65536>(ce::next_pow2_at_least(cols, 4096), [&](auto bn) {
    return with_int<16, 32, 64>(items, [&](auto it) {
      return with_bool(packed, [&](auto pk) {
        constexpr int L = V(bn) / V(it);  // (a block per row; more registers than the SM has: not built)
        if constexpr (L > 1024 || L < 32 || ce::ce_reg_cap(V(it) / 8, 0, V(pk), 8) * L > 65536)
          return cudaErrorNotSupported;
        else
          return ce::launch_register<T, V(bn), V(it), V(pk)>(p, stream);
      });
    });
  });
}

#undef V

}  // namespace softmax_harness
