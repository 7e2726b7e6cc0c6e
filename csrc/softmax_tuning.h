// Launch variants of the fused softmax kernels, for choosing the launch table in softmax_kernels.cu
// (`python -m harness.bench cuda-sweep`). bf16 only, not causal, 16-byte aligned rows (the benchmark's
// inputs). No torch header. Not used by the `cuda` method itself.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace softmax_harness {

// path 0, register: rows of up to next_pow2(cols) <= 32768 with `items` elements per thread (threads
// unused). path 1, cluster: CTAs of `threads` threads x items elements, as many (<= 16) as the row
// needs. path 2, split: the same slices over ordinary blocks meeting in global memory (<= 128 slices;
// `workspace` of tuned_workspace_bytes(rows) bytes). Forward `merged` / `packed`: the reduction scheme
// and the packed row storage of fwd_register_kernel (split: always merged). Backward `cap`: registers
// capped for more blocks per SM (see min_blocks in softmax_device.cuh). cudaErrorNotSupported for a
// variant that was not compiled. path 3, persist: blocks of `threads` threads x items elements looping
// over rows, `buffers` rows prefetched into shared memory (1 or 2; the `merged` / `cap` flags unused).
cudaError_t tuned_fwd(const void* x, void* y, int64_t rows, int64_t cols, int items, bool merged,
                      bool packed, int path, int threads, int buffers, void* workspace, cudaStream_t stream);
cudaError_t tuned_bwd(const void* y, const void* dy, void* dx, int64_t rows, int64_t cols, int items,
                      bool cap, int path, int threads, int buffers, void* workspace, cudaStream_t stream);
int64_t tuned_workspace_bytes(int64_t rows);

}  // namespace softmax_harness
