// Launch variants of the fused softmax kernels, for choosing the launch table in softmax_kernels.cu
// (`python -m harness.bench cuda-sweep`). bf16 only, not causal, 16-byte aligned rows (the benchmark's
// inputs). No torch header. Not used by the `cuda` method itself.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace softmax_harness {

// Register path (cluster_threads == 0): rows of up to next_pow2(cols) <= 32768 with `items` elements
// per thread. Cluster path (cluster_threads > 0): CTAs of cluster_threads threads x items elements,
// as many (<= 16) as the row needs. Forward `merged` / `packed`: the reduction scheme and the packed
// row storage of fwd_register_kernel. Backward `cap`: registers capped for more blocks per SM (see
// min_blocks in softmax_device.cuh). cudaErrorNotSupported for a variant that was not compiled.
cudaError_t tuned_fwd(const void* x, void* y, int64_t rows, int64_t cols, int items, bool merged,
                      bool packed, int cluster_threads, cudaStream_t stream);
cudaError_t tuned_bwd(const void* y, const void* dy, void* dx, int64_t rows, int64_t cols, int items,
                      bool cap, int cluster_threads, cudaStream_t stream);

}  // namespace softmax_harness
