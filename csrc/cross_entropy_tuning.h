// Launch variants of the fused cross-entropy kernels, for choosing the launch table in
// cross_entropy_kernels.cu (`python -m harness.bench cuda-ce-sweep`). bf16 only, 16-byte aligned dense
// rows (the sweep's inputs), ignore_index -100. No torch header. Not used by the `cuda` method itself.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace softmax_harness {

// One launch of ce_rows over dense bf16 logits x (rows, cols) into the gradient g (may be x) and the
// per-row loss, gradient scale `scale` (a device scalar, or nullptr for 1):
//  path 0, register: rows of up to next_pow2(cols) <= 65536 columns, `items` elements per thread
//          (threads = next_pow2(cols) / items, 32..1024; fewer than 32: several rows per warp), `packed`;
//  path 1, hybrid: a block of `threads` per row, `items` elements per thread in registers and
//          `smem_items` in shared memory (packed);
//  path 2, split: slices of threads x (items + smem_items) columns (balanced over ceil(cols / that)
//          slices; smem_items > 0: hybrid slices, packed), `workspace` of ce_tuned_workspace_bytes(rows);
//  path 3, stream: a block of `threads` per row.
// cudaErrorNotSupported for a variant that was not compiled or cannot take the rows.
cudaError_t ce_tuned(const void* x, void* g, float* loss, const int64_t* targets, const float* scale, int64_t rows,
                     int64_t cols, int path, int threads, int items, int smem_items, bool packed, void* workspace,
                     cudaStream_t stream);
// paths 1 and 2 (cross_entropy_tuning_split.cu: its own translation unit, compiled in parallel)
cudaError_t ce_tuned_split(const void* x, void* g, float* loss, const int64_t* targets, const float* scale,
                           int64_t rows, int64_t cols, int path, int threads, int items, int smem_items, bool packed,
                           void* workspace, cudaStream_t stream);
int64_t ce_tuned_workspace_bytes(int64_t rows);

}  // namespace softmax_harness
