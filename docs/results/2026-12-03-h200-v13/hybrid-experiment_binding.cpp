// Record of the session-17 experiment (scripts/_exp_hyb_binding.cpp on the H200; see docs/perf.md, "v13").
// Experiment binding (pybind): run one forward variant of _exp_hyb.cu.
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime.h>
extern "C" int hyb_fwd(int v, int half, const void* x, void* y, long rows, long cols, long stride, long tq, long diag,
                       float scale, int causal, void* stream);
torch::Tensor run(int64_t v, torch::Tensor x, double scale, bool causal, int64_t tq, int64_t diag) {
  auto y = torch::empty({x.size(0), x.size(1)}, x.options());
  const int e = hyb_fwd((int)v, x.scalar_type() == at::kHalf, x.data_ptr(), y.data_ptr(), x.size(0), x.size(1), x.stride(0),
                        tq, diag, (float)scale, causal, at::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(e == 0, "launch failed: ", e, " ", cudaGetErrorString((cudaError_t)e));
  return y;
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("run", &run); }
