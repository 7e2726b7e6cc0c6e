// The hybrid and split launch variants behind the table in cross_entropy_kernels.cu (see
// cross_entropy_tuning.h).
#include "cross_entropy_tuning.h"

#include "cross_entropy/launch.cuh"
#include "softmax_tuning.h"  // tuning::with_int

namespace softmax_harness {
namespace {

using T = __nv_bfloat16;

// The variants compiled: (threads, items, smem_items, packed).
template <int L, int RI, int SI, bool PK>
struct Shape {};

template <typename F>
cudaError_t with_hybrid_shape(int threads, int items, int smem, F&& f) {
  cudaError_t err = cudaErrorNotSupported;
  auto one = [&](auto shape, int l, int ri, int si) {
    if (threads == l && items == ri && smem == si) err = f(shape);
  };
  one(Shape<512, 64, 32, true>{}, 512, 64, 32);
  one(Shape<512, 64, 40, true>{}, 512, 64, 40);
  one(Shape<512, 64, 48, true>{}, 512, 64, 48);
  one(Shape<512, 64, 64, true>{}, 512, 64, 64);
  one(Shape<512, 32, 64, true>{}, 512, 32, 64);
  one(Shape<512, 32, 96, true>{}, 512, 32, 96);
  one(Shape<256, 64, 128, true>{}, 256, 64, 128);
  one(Shape<1024, 32, 32, true>{}, 1024, 32, 32);
  return err;
}

template <typename F>
cudaError_t with_split_shape(int threads, int items, int smem, bool packed, F&& f) {
  cudaError_t err = cudaErrorNotSupported;
  auto one = [&](auto shape, int l, int ri, int si, bool pk) {
    if (threads == l && items == ri && smem == si && packed == pk) err = f(shape);
  };
  one(Shape<256, 32, 0, true>{}, 256, 32, 0, true);
  one(Shape<256, 64, 0, true>{}, 256, 64, 0, true);
  one(Shape<512, 32, 0, true>{}, 512, 32, 0, true);
  one(Shape<512, 64, 0, true>{}, 512, 64, 0, true);
  one(Shape<1024, 32, 0, true>{}, 1024, 32, 0, true);
  one(Shape<256, 32, 0, false>{}, 256, 32, 0, false);
  one(Shape<512, 16, 0, false>{}, 512, 16, 0, false);
  one(Shape<512, 64, 32, true>{}, 512, 64, 32, true);
  one(Shape<512, 64, 64, true>{}, 512, 64, 64, true);
  return err;
}

template <int L, int RI, int SI, bool PK>
cudaError_t run_hybrid(Shape<L, RI, SI, PK>, const ce::CeParams& p, cudaStream_t stream) {
  if (p.cols > (int64_t)L * (RI + SI)) return cudaErrorNotSupported;
  return ce::launch_hybrid<T, L, RI, SI>(p, stream);
}

template <int L, int RI, int SI, bool PK>
cudaError_t run_split(Shape<L, RI, SI, PK>, const ce::CeParams& p, int sms, void* workspace, cudaStream_t stream) {
  const ce::SplitPlan plan = ce::split_plan(p.cols, (int64_t)L * (RI + SI), 8, 1);
  if (!ce::split_fits(p.rows, plan, sms)) return cudaErrorNotSupported;
  return ce::launch_split<T, L, RI, SI, PK>(p, plan, workspace, stream);
}

}  // namespace

cudaError_t ce_tuned_split(const void* x, void* g, float* loss, const int64_t* targets, const float* scale,
                           int64_t rows, int64_t cols, int path, int threads, int items, int smem_items, bool packed,
                           void* workspace, cudaStream_t stream) {
  ce::CeParams p{};
  p.x = x;
  p.g = g;
  p.loss = loss;
  p.tgt = targets;
  p.scale = scale;
  p.rows = rows;
  p.xs = cols;
  p.gs = cols;
  p.ignore = -100;
  p.cols = (int)cols;
  p.slice = (int)cols;
  if (path == 1) {
    if (!packed) return cudaErrorNotSupported;
    return with_hybrid_shape(threads, items, smem_items, [&](auto s) { return run_hybrid(s, p, stream); });
  }
  if (path != 2) return cudaErrorNotSupported;
  int sms = 0;
  if (ce::sm_count(&sms) != cudaSuccess) return cudaErrorNotSupported;
  return with_split_shape(threads, items, smem_items, packed,
                          [&](auto s) { return run_split(s, p, sms, workspace, stream); });
}

}  // namespace softmax_harness
