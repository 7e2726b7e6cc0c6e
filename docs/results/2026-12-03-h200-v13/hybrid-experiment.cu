// Record of the session-17 experiment (scripts/_exp_hyb.cu on the H200; see docs/perf.md, "v13").
// Experiment (session 17): the hybrid forward (half of a 16-bit row in registers, half in shared memory,
// a block per row, two per SM) against the landed persistent forward, as plain C entry points.
#include "softmax_device.cuh"
using namespace softmax_harness::detail;
template <typename T>
static cudaError_t go(int v, const Args& a) {
  switch (v) {
    case 0: return launch_fwd_persist<T, 1024, 64, 1, 1, true, true>(a);
    case 1: return launch_fwd_hybrid<T, 512, 64, 64>(a);
    case 2: return launch_fwd_hybrid<T, 512, 32, 96>(a);
    case 3: return launch_fwd_hybrid<T, 256, 64, 192>(a);
    case 4: return launch_fwd_hybrid<T, 512, 64, 32>(a);
  }
  return cudaErrorInvalidValue;
}
extern "C" int hyb_fwd(int v, int half, const void* x, void* y, long rows, long cols, long stride, long tq, long diag,
                       float scale, int causal, void* stream) {
  Args a{x, nullptr, y, rows, cols, stride, tq, diag, scale, causal != 0, (cudaStream_t)stream, nullptr};
  return (int)(half ? go<__half>(v, a) : go<__nv_bfloat16>(v, a));
}
