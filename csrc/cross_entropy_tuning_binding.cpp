// Torch binding of the cross-entropy launch variants (cross_entropy_tuning.h) for
// `python -m harness.bench cuda-ce-sweep`. Not part of the `cuda` method: built as its own extension,
// only by the sweep.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "cross_entropy_tuning.h"

namespace {

// The per-row losses, or an empty tensor when this variant does not exist for the shape; the gradient
// (softmax - onehot) * scale goes into grad (which may be logits).
at::Tensor ce_variant(const at::Tensor& logits, const at::Tensor& targets, const at::Tensor& scale, const at::Tensor& grad,
                      int64_t path, int64_t threads, int64_t items, int64_t smem_items, bool packed) {
  TORCH_CHECK(logits.is_cuda() && logits.scalar_type() == at::kBFloat16 && logits.is_contiguous() && logits.dim() == 2,
              "ce-sweep variants take contiguous 2-d bfloat16 CUDA logits");
  TORCH_CHECK(grad.sizes() == logits.sizes() && grad.scalar_type() == at::kBFloat16 && grad.is_contiguous(),
              "ce-sweep variants take a contiguous bfloat16 gradient buffer of the logits' shape");
  TORCH_CHECK(targets.scalar_type() == at::kLong && targets.is_contiguous() && targets.numel() == logits.size(0),
              "ce-sweep variants take contiguous int64 targets, one per row");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.numel() == 1, "ce-sweep variants take a float32 scalar scale");
  c10::cuda::CUDAGuard guard(logits.device());
  at::Tensor loss = at::empty({logits.size(0)}, logits.options().dtype(at::kFloat));
  at::Tensor ws = at::empty({softmax_harness::ce_tuned_workspace_bytes(logits.size(0))}, logits.options().dtype(at::kByte));
  const cudaError_t err = softmax_harness::ce_tuned(
      logits.data_ptr(), grad.data_ptr(), loss.data_ptr<float>(), targets.data_ptr<int64_t>(), scale.data_ptr<float>(),
      logits.size(0), logits.size(1), (int)path, (int)threads, (int)items, (int)smem_items, packed, ws.data_ptr(),
      c10::cuda::getCurrentCUDAStream());
  if (err == cudaErrorNotSupported) return at::Tensor();
  TORCH_CHECK(err == cudaSuccess, "ce-sweep variant launch failed: ", cudaGetErrorString(err));
  return loss;
}

}  // namespace

TORCH_LIBRARY(softmax_harness_cuda_ce_tuning, m) {
  m.def("ce_variant(Tensor logits, Tensor targets, Tensor scale, Tensor(a!) grad, int path, int threads, int items, "
        "int smem_items, bool packed) -> Tensor",
        &ce_variant);
}
