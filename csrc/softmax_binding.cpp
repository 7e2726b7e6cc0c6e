// Thin PyTorch binding of the fused softmax kernels (csrc/softmax_kernels.cu): registers the ops
// softmax_harness_cuda::softmax_fwd / softmax_bwd with TORCH_LIBRARY and their CUDA implementations
// with TORCH_LIBRARY_IMPL, checks inputs with clear messages and launches on the current CUDA stream.
// Fake (meta) implementations and autograd are registered from Python (kernels/methods/cuda/op.py).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <limits>
#include <string>

#include "softmax_kernels.h"

namespace {

using softmax_harness::DType;

DType dtype_of(const at::Tensor& t, const char* what) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return DType::F32;
    case at::kHalf:
      return DType::F16;
    case at::kBFloat16:
      return DType::BF16;
    default:
      TORCH_CHECK(false, "cuda softmax: ", what, " has dtype ", t.scalar_type(),
                  "; supported dtypes: float32, float16, bfloat16");
  }
}

void check_input(const at::Tensor& t, const char* what, bool causal) {
  TORCH_CHECK(t.is_cuda(), "cuda softmax: ", what, " must be a CUDA tensor, got one on ", t.device());
  TORCH_CHECK(t.dim() >= 1 && t.size(-1) > 0, "cuda softmax: ", what,
              " needs a non-empty last dimension, got shape ", t.sizes());
  TORCH_CHECK(!causal || t.dim() >= 2, "cuda softmax: causal needs shape (..., Tq, Tk), got ", t.sizes());
  TORCH_CHECK(t.size(-1) <= std::numeric_limits<int32_t>::max(), "cuda softmax: rows longer than 2^31 - 1");
}

// (rows, cols) view with contiguous columns; one copy when the leading dims do not flatten.
at::Tensor as_rows(const at::Tensor& t) {
  const int64_t cols = t.size(-1);
  if (t.stride(-1) == 1) {
    try {
      return t.view({-1, cols});
    } catch (const c10::Error&) {
    }
  }
  return t.contiguous().view({-1, cols});
}

// Scratch for the launch (the split path's counters and partials), from PyTorch's caching allocator
// on the current stream; empty when the launch needs none.
at::Tensor workspace_for(const at::Tensor& like, DType dt, bool backward, int64_t rows, int64_t cols) {
  const int64_t bytes = softmax_harness::softmax_workspace_bytes(dt, backward, rows, cols);
  return at::empty({bytes}, like.options().dtype(at::kByte));
}

void causal_geometry(const at::Tensor& t, bool causal, int64_t* tq, int64_t* diag) {
  *tq = causal ? t.size(-2) : 1;
  *diag = causal ? t.size(-1) - t.size(-2) : 0;
}

at::Tensor softmax_fwd(const at::Tensor& x, double scale, bool causal) {
  check_input(x, "scores", causal);
  const DType dt = dtype_of(x, "scores");
  c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor x2 = as_rows(x);
  at::Tensor y = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  int64_t tq, diag;
  causal_geometry(x, causal, &tq, &diag);
  at::Tensor ws = workspace_for(x, dt, false, x2.size(0), x2.size(1));
  const cudaError_t err = softmax_harness::softmax_fwd(
      dt, x2.data_ptr(), y.data_ptr(), x2.size(0), x2.size(1), x2.size(0) > 1 ? x2.stride(0) : x2.size(1),
      tq, diag, static_cast<float>(scale), causal, ws.numel() ? ws.data_ptr() : nullptr,
      c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "cuda softmax forward launch failed: ", cudaGetErrorString(err));
  return y;
}

at::Tensor softmax_bwd(const at::Tensor& y, const at::Tensor& dy, double scale, bool causal) {
  check_input(y, "y", causal);
  check_input(dy, "dy", causal);
  TORCH_CHECK(y.sizes() == dy.sizes(), "cuda softmax backward: y ", y.sizes(), " and dy ", dy.sizes(),
              " differ in shape");
  TORCH_CHECK(y.scalar_type() == dy.scalar_type(), "cuda softmax backward: y and dy differ in dtype");
  TORCH_CHECK(y.device() == dy.device(), "cuda softmax backward: y and dy are on different devices");
  const DType dt = dtype_of(y, "y");
  c10::cuda::CUDAGuard guard(y.device());
  const at::Tensor y2 = y.contiguous().view({-1, y.size(-1)});
  const at::Tensor dy2 = as_rows(dy);
  at::Tensor dx = at::empty(y.sizes(), y.options().memory_format(at::MemoryFormat::Contiguous));
  int64_t tq, diag;
  causal_geometry(y, causal, &tq, &diag);
  at::Tensor ws = workspace_for(y, dt, true, y2.size(0), y2.size(1));
  const cudaError_t err = softmax_harness::softmax_bwd(
      dt, y2.data_ptr(), dy2.data_ptr(), dx.data_ptr(), y2.size(0), y2.size(1),
      dy2.size(0) > 1 ? dy2.stride(0) : dy2.size(1), tq, diag, static_cast<float>(scale), causal,
      ws.numel() ? ws.data_ptr() : nullptr, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "cuda softmax backward launch failed: ", cudaGetErrorString(err));
  return dx;
}

std::string softmax_path(int64_t dtype, bool backward, int64_t rows, int64_t cols, bool aligned) {
  return softmax_harness::softmax_path(static_cast<DType>(dtype), backward, rows, cols, aligned);
}

}  // namespace

TORCH_LIBRARY(softmax_harness_cuda, m) {
  // the fake implementations and autograd live in this Python module
  m.set_python_module("kernels.methods.cuda.op");
  m.def("softmax_fwd(Tensor x, float scale, bool causal) -> Tensor");
  m.def("softmax_bwd(Tensor y, Tensor dy, float scale, bool causal) -> Tensor");
  m.def("softmax_path(int dtype, bool backward, int rows, int cols, bool aligned) -> str", &softmax_path);
}

TORCH_LIBRARY_IMPL(softmax_harness_cuda, CUDA, m) {
  m.impl("softmax_fwd", &softmax_fwd);
  m.impl("softmax_bwd", &softmax_bwd);
}
