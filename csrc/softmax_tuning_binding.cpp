// Torch binding of the launch variants (softmax_tuning.h) for `python -m harness.bench cuda-sweep`.
// Not part of the `cuda` method: built as its own extension, only by the sweep.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "softmax_tuning.h"

namespace {

void check(const at::Tensor& t) {
  TORCH_CHECK(t.is_cuda() && t.scalar_type() == at::kBFloat16 && t.is_contiguous() && t.dim() == 2,
              "cuda-sweep variants take contiguous 2-d bfloat16 CUDA tensors");
}

// Returns the output, or an empty tensor when this variant does not exist for the shape.
at::Tensor workspace(const at::Tensor& like) {
  return at::empty({softmax_harness::tuned_workspace_bytes(like.size(0))}, like.options().dtype(at::kByte));
}

at::Tensor fwd_variant(const at::Tensor& x, int64_t items, bool merged, bool packed, int64_t path, int64_t threads, int64_t buffers,
                       int64_t ctas) {
  check(x);
  c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty_like(x);
  at::Tensor ws = workspace(x);
  const cudaError_t err = softmax_harness::tuned_fwd(x.data_ptr(), y.data_ptr(), x.size(0), x.size(1), (int)items,
                                                     merged, packed, (int)path, (int)threads, (int)buffers, (int)ctas, ws.data_ptr(),
                                                     c10::cuda::getCurrentCUDAStream());
  if (err == cudaErrorNotSupported) return at::Tensor();
  TORCH_CHECK(err == cudaSuccess, "variant launch failed: ", cudaGetErrorString(err));
  return y;
}

at::Tensor bwd_variant(const at::Tensor& y, const at::Tensor& dy, int64_t items, bool cap, int64_t path, int64_t threads, int64_t buffers,
                       int64_t ctas) {
  check(y);
  check(dy);
  c10::cuda::CUDAGuard guard(y.device());
  at::Tensor dx = at::empty_like(y);
  at::Tensor ws = workspace(y);
  const cudaError_t err = softmax_harness::tuned_bwd(y.data_ptr(), dy.data_ptr(), dx.data_ptr(), y.size(0), y.size(1),
                                                     (int)items, cap, (int)path, (int)threads, (int)buffers, (int)ctas, ws.data_ptr(),
                                                     c10::cuda::getCurrentCUDAStream());
  if (err == cudaErrorNotSupported) return at::Tensor();
  TORCH_CHECK(err == cudaSuccess, "variant launch failed: ", cudaGetErrorString(err));
  return dx;
}

}  // namespace

TORCH_LIBRARY(softmax_harness_cuda_tuning, m) {
  m.def("fwd_variant(Tensor x, int items, bool merged, bool packed, int path, int threads, int buffers, int ctas) -> Tensor", &fwd_variant);
  m.def("bwd_variant(Tensor y, Tensor dy, int items, bool cap, int path, int threads, int buffers, int ctas) -> Tensor", &bwd_variant);
}
