// Thin PyTorch binding of the fused cross-entropy kernels (csrc/cross_entropy_kernels.cu): adds the ops
// softmax_harness_cuda::ce_rows / scale_grad_ / ce_path / ce_take_target_error to the namespace that
// softmax_binding.cpp defines (TORCH_LIBRARY_FRAGMENT), checks inputs with clear messages and launches on
// the current CUDA stream. Fake implementations live in Python (kernels/methods/cuda/op.py); the
// differentiable cross-entropy built from these primitives is kernels/methods/cuda/cross_entropy.py.
//
// Out-of-range targets: the kernels give such a row loss NaN and a NaN gradient and record the first
// one on the device; kernels.methods.cuda.check_targets() (or every launch, with SOFTMAX_HARNESS_CE_CHECK=1 in the
// environment: a device sync per call, for debugging) raises an error naming it. Nothing syncs by default.
#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "cross_entropy_kernels.h"

namespace {

using softmax_harness::DType;

DType ce_dtype(const at::Tensor& t, const char* op, const char* what) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return DType::F32;
    case at::kHalf:
      return DType::F16;
    case at::kBFloat16:
      return DType::BF16;
    default:
      TORCH_CHECK(false, op, ": ", what, " has dtype ", t.scalar_type(), "; supported dtypes: float32, float16, bfloat16");
  }
}

bool check_every_launch() {
  static const bool on = [] {
    const char* e = std::getenv("SOFTMAX_HARNESS_CE_CHECK");
    return e != nullptr && *e != '\0' && std::string(e) != "0";
  }();
  return on;
}

// The out-of-range target record of the current device, cleared: a CPU int64 tensor [found, row, target,
// cols]. kernels.methods.cuda.check_targets raises from it in Python: raising from this op (no tensor
// argument) crashed the process on the H200 (a segfault in the test that expects the error).
at::Tensor ce_take_target_error() {
  bool found = false;
  int64_t row = 0, target = 0, cols = 0;
  const cudaError_t err = softmax_harness::ce_take_error(&found, &row, &target, &cols);
  TORCH_CHECK(err == cudaSuccess, "cuda cross_entropy: reading the target check failed: ", cudaGetErrorString(err));
  const std::vector<int64_t> rec{found ? 1 : 0, row, target, cols};
  return at::tensor(rec, at::TensorOptions().dtype(at::kLong));
}

// Raises if a launch on the current device recorded an out-of-range target (and clears the record); the
// SOFTMAX_HARNESS_CE_CHECK=1 debugging path of ce_rows.
void ce_check_targets() {
  bool found = false;
  int64_t row = 0, target = 0, cols = 0;
  const cudaError_t err = softmax_harness::ce_take_error(&found, &row, &target, &cols);
  TORCH_CHECK(err == cudaSuccess, "cuda cross_entropy: reading the target check failed: ", cudaGetErrorString(err));
  TORCH_CHECK(!found, "cuda cross_entropy: target ", target, " (row ", row, ") is outside [0, ", cols,
              ") and is not ignore_index; that row's loss and gradient are NaN");
}

// The per-row losses (fp32, (N,)) of logits (N, V) against targets (N,), and, when `grad` is given, the
// gradient (softmax - onehot) * grad_scale written into it (grad may be logits itself: in place).
at::Tensor ce_rows(const at::Tensor& logits, const at::Tensor& targets, int64_t ignore_index,
                   const std::optional<at::Tensor>& grad_scale, const std::optional<at::Tensor>& grad, int64_t path) {
  constexpr const char* op = "cuda ce_rows";
  TORCH_CHECK(logits.is_cuda(), op, ": logits must be a CUDA tensor, got one on ", logits.device());
  TORCH_CHECK(logits.dim() == 2 && logits.size(1) >= 1, op, ": logits must be (N, V) with V >= 1, got ", logits.sizes());
  TORCH_CHECK(logits.size(1) <= std::numeric_limits<int32_t>::max() && logits.size(0) <= std::numeric_limits<int32_t>::max(),
              op, ": N and V must be below 2^31, got ", logits.sizes());
  const DType dt = ce_dtype(logits, op, "logits");
  TORCH_CHECK(targets.device() == logits.device(), op, ": targets on ", targets.device(), ", logits on ", logits.device());
  TORCH_CHECK(targets.dim() == 1 && targets.size(0) == logits.size(0), op, ": targets must be (N,) = (", logits.size(0),
              ",), got ", targets.sizes());
  TORCH_CHECK(targets.scalar_type() == at::kLong || targets.scalar_type() == at::kInt, op,
              ": targets must be int64 (or int32), got ", targets.scalar_type());
  TORCH_CHECK(path >= softmax_harness::kCeAuto && path <= softmax_harness::kCeStream, op, ": path ", path, " is not one of -1..3");
  c10::cuda::CUDAGuard guard(logits.device());
  const int64_t n = logits.size(0), v = logits.size(1);
  at::Tensor loss = at::empty({n}, logits.options().dtype(at::kFloat));
  if (n == 0) return loss;
  const at::Tensor x = logits.stride(1) == 1 ? logits : logits.contiguous();  // columns contiguous (one copy)
  const at::Tensor t = (targets.scalar_type() == at::kLong ? targets : targets.to(at::kLong)).contiguous();

  at::Tensor scale;
  if (grad_scale.has_value()) {
    const at::Tensor& s = *grad_scale;
    TORCH_CHECK(s.device() == logits.device(), op, ": grad_scale on ", s.device(), ", logits on ", logits.device());
    TORCH_CHECK(s.numel() == 1 || (s.dim() == 1 && s.size(0) == n), op, ": grad_scale must be a scalar or (N,) = (", n,
                ",), got ", s.sizes());
    scale = s.to(at::kFloat).contiguous();
  }

  // the gradient buffer: written directly when its columns are contiguous (in place when it is the
  // logits themselves), else into a dense temporary copied over it after the launch
  at::Tensor g, target_grad;
  if (grad.has_value()) {
    const at::Tensor& gb = *grad;
    TORCH_CHECK(gb.device() == logits.device(), op, ": grad on ", gb.device(), ", logits on ", logits.device());
    TORCH_CHECK(gb.sizes() == logits.sizes(), op, ": grad ", gb.sizes(), " and logits ", logits.sizes(), " differ in shape");
    TORCH_CHECK(gb.scalar_type() == logits.scalar_type(), op, ": grad must have the logits' dtype ", logits.scalar_type(),
                ", got ", gb.scalar_type());
    at::assert_no_internal_overlap(gb);
    const bool in_place = gb.data_ptr() == x.data_ptr() && gb.strides() == x.strides();
    if (!in_place) at::assert_no_overlap(gb, x);
    if (gb.stride(1) == 1) {
      g = gb;
    } else {
      g = at::empty(gb.sizes(), gb.options().memory_format(at::MemoryFormat::Contiguous));
      target_grad = gb;
    }
  }

  softmax_harness::CeLaunch a{};
  a.dtype = dt;
  a.logits = x.data_ptr();
  a.logits_stride = x.stride(0);
  a.grad = g.defined() ? g.data_ptr() : nullptr;
  a.grad_stride = g.defined() ? g.stride(0) : 0;
  a.loss = loss.data_ptr<float>();
  a.targets = t.data_ptr<int64_t>();
  a.ignore_index = ignore_index;
  a.grad_scale = scale.defined() ? scale.data_ptr<float>() : nullptr;
  a.grad_scale_stride = scale.defined() && scale.numel() != 1 ? 1 : 0;
  a.rows = n;
  a.cols = v;
  a.path = (int)path;
  a.stream = c10::cuda::getCurrentCUDAStream();
  at::Tensor ws = at::empty({softmax_harness::ce_workspace_bytes(a)}, logits.options().dtype(at::kByte));
  a.workspace = ws.numel() ? ws.data_ptr() : nullptr;
  const cudaError_t err = softmax_harness::ce_rows(a);
  TORCH_CHECK(err != cudaErrorInvalidValue || path == softmax_harness::kCeAuto, op, ": the forced path ", path,
              " cannot take these rows (", n, " x ", v, ", ", logits.scalar_type(), ", strides ", x.strides(), ")");
  TORCH_CHECK(err == cudaSuccess, op, ": launch failed: ", cudaGetErrorString(err));
  if (target_grad.defined()) target_grad.copy_(g);
  if (check_every_launch()) ce_check_targets();
  return loss;
}

// grad *= g in place: g a scalar (numel 1) or one value per row (grad.size(0) values); a block whose g
// is exactly 1 returns at once.
void scale_grad_(const at::Tensor& grad, const at::Tensor& g) {
  constexpr const char* op = "cuda scale_grad_";
  TORCH_CHECK(grad.is_cuda(), op, ": grad must be a CUDA tensor, got one on ", grad.device());
  TORCH_CHECK(g.device() == grad.device(), op, ": g on ", g.device(), ", grad on ", grad.device());
  const DType dt = ce_dtype(grad, op, "grad");
  const bool per_row = g.numel() != 1;
  TORCH_CHECK(!per_row || (grad.dim() >= 1 && g.numel() == grad.size(0)), op, ": g must be a scalar or one value per row (",
              grad.dim() >= 1 ? grad.size(0) : 1, "), got ", g.sizes());
  if (grad.numel() == 0) return;
  c10::cuda::CUDAGuard guard(grad.device());
  const at::Tensor s = g.to(at::kFloat).contiguous();
  int64_t rows = 0, cols = 0, stride = 0;
  if (!per_row && grad.is_contiguous()) {
    rows = 1;
    cols = grad.numel();
    stride = cols;
  } else if (grad.dim() <= 2 && grad.stride(-1) == 1) {
    rows = grad.dim() == 2 ? grad.size(0) : (per_row ? grad.size(0) : 1);
    cols = grad.dim() == 2 ? grad.size(1) : (per_row ? 1 : grad.size(0));
    stride = grad.dim() == 2 ? grad.stride(0) : (per_row ? 1 : cols);
  } else {  // other layouts: not the fused primitives' own buffers; correct, one pass
    std::vector<int64_t> shape(grad.dim(), 1);
    if (per_row) shape[0] = grad.size(0);
    grad.mul_(per_row ? s.view(shape) : s.view({}));
    return;
  }
  const cudaError_t err = softmax_harness::scale_grad(dt, grad.data_ptr(), rows, cols, stride, s.data_ptr<float>(),
                                                      per_row ? 1 : 0, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, op, ": launch failed: ", cudaGetErrorString(err));
}

std::string ce_path(int64_t dtype, int64_t rows, int64_t cols, bool aligned, int64_t path) {
  return softmax_harness::ce_path(static_cast<DType>(dtype), rows, cols, aligned, (int)path);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(softmax_harness_cuda, m) {
  m.set_python_module("kernels.methods.cuda.op");  // the fake implementations
  m.def("ce_rows(Tensor logits, Tensor targets, int ignore_index, Tensor? grad_scale, Tensor(a!)? grad, int path=-1) -> Tensor");
  m.def("scale_grad_(Tensor(a!) grad, Tensor g) -> ()");
  m.def("ce_path(int dtype, int rows, int cols, bool aligned, int path=-1) -> str", &ce_path);
  m.def("ce_take_target_error() -> Tensor", &ce_take_target_error);
}

TORCH_LIBRARY_IMPL(softmax_harness_cuda, CUDA, m) {
  m.impl("ce_rows", &ce_rows);
  m.impl("scale_grad_", &scale_grad_);
}
