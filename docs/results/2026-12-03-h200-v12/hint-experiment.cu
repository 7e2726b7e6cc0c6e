// Record of the session-16 experiment (scripts/_exp_hint.cu on the H200; see docs/perf.md, "v12").
// Experiment: the persistent forward (bf16, 1024 x 64 packed, one buffer) as a plain C entry point, built
// with or without the cache-hint macros (SOFTMAX_LOAD_HINT, SOFTMAX_STORE_CS).
#include "softmax_device.cuh"
using namespace softmax_harness::detail;
extern "C" int fwd_persist(const void* x, void* y, long rows, long cols, float scale, void* stream) {
  Args a{x, nullptr, y, rows, cols, cols, 1, 0, scale, false, (cudaStream_t)stream, nullptr};
  return (int)launch_fwd_persist<__nv_bfloat16, 1024, 64, 1, 1, true, true>(a);
}
