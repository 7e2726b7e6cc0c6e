// Launch variants of the fused softmax kernels, for choosing the launch table in softmax_kernels.cu
// (`python -m harness.bench cuda-sweep`). bf16 only, not causal, 16-byte aligned rows (the benchmark's
// inputs). No torch header. Not used by the `cuda` method itself.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

namespace softmax_harness {

// path 0, register: rows of up to next_pow2(cols) <= 32768 with `items` elements per thread (threads
// unused). path 1, cluster: CTAs of `threads` threads x items elements, as many (<= 16) as the row
// needs. path 2, split: the same slices over ordinary blocks meeting in global memory (<= 128 slices;
// `workspace` of tuned_workspace_bytes(rows) bytes). Forward `merged` / `packed`: the reduction scheme
// and the packed row storage of fwd_register_kernel (split and cluster: merged only). Backward `cap`: registers
// capped for more blocks per SM (see min_blocks in softmax/register.cuh). path 3, persist: blocks of
// `threads` threads x items elements looping over rows, `buffers` (1-3) rows prefetched into shared
// memory, `ctas` (1, 2, 4, 8) CTAs per row (a cluster when > 1; forward then always merged); forward
// `merged` / `packed` as above (64 elements per thread: packed only), backward `cap` unused.
// `ctas` is ignored by paths 0-2. cudaErrorNotSupported for a variant that was not compiled.
cudaError_t tuned_fwd(const void* x, void* y, int64_t rows, int64_t cols, int items, bool merged,
                      bool packed, int path, int threads, int buffers, int ctas, void* workspace,
                      cudaStream_t stream);
cudaError_t tuned_bwd(const void* y, const void* dy, void* dx, int64_t rows, int64_t cols, int items,
                      bool cap, int path, int threads, int buffers, int ctas, void* workspace,
                      cudaStream_t stream);
// path 3 of the two above (softmax_tuning_persist.cu: its own translation unit, compiled in parallel).
cudaError_t tuned_fwd_persist(const void* x, void* y, int64_t rows, int64_t cols, int items, bool merged,
                              bool packed, int threads, int buffers, int ctas, cudaStream_t stream);
cudaError_t tuned_bwd_persist(const void* y, const void* dy, void* dx, int64_t rows, int64_t cols, int items,
                              int threads, int buffers, int ctas, cudaStream_t stream);
// path 4 of tuned_fwd, hybrid: blocks of `threads` threads, a row each, `items` elements per thread in
// registers and the rest of the row in shared memory (softmax_tuning_persist.cu).
cudaError_t tuned_fwd_hybrid(const void* x, void* y, int64_t rows, int64_t cols, int items, int threads,
                             cudaStream_t stream);
int64_t tuned_workspace_bytes(int64_t rows);


namespace tuning {
// f(std::integral_constant<int, v>) for the runtime value v, if it is one of Vs; else not supported.
template <int... Vs, typename F>
cudaError_t with_int(int v, F&& f) {
  cudaError_t err = cudaErrorNotSupported;
  (void)((v == Vs ? (err = f(std::integral_constant<int, Vs>{}), true) : false) || ...);
  return err;
}

template <typename F>
cudaError_t with_bool(bool v, F&& f) {
  return v ? f(std::true_type{}) : f(std::false_type{});
}
}  // namespace tuning

}  // namespace softmax_harness
