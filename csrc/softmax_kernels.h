// Fused scale + causal mask + softmax, forward and backward: the launchers' interface.
// Plain CUDA C++: no torch header, so `nvcc -c csrc/softmax_kernels.cu` builds it anywhere (CI does).
//
// Rows x cols layout: element (r, c) of the input lives at base + r * row_stride + c (columns are
// contiguous); outputs are dense (row stride == cols). For causal scores of shape (..., Tq, Tk),
// row r is query i = r mod tq and keeps the keys j <= i + diag (diag = Tk - Tq): masked entries are 0
// with gradient 0; a row with no unmasked key is all zeros.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace softmax_harness {

enum class DType : int { F32 = 0, F16 = 1, BF16 = 2 };

// Bytes of device workspace a launch of rows x cols needs (0 for most; the split path keeps counters
// and partials there). Pass that much (16-byte aligned) as `workspace`, untouched by anything else
// until the launch has run (stream order); its contents need no initialisation.
int64_t softmax_workspace_bytes(DType dtype, bool backward, int64_t rows, int64_t cols);

// y = softmax(scale * x) over each row (fp32 math), y dense rows x cols.
cudaError_t softmax_fwd(DType dtype, const void* x, void* y, int64_t rows, int64_t cols,
                        int64_t x_row_stride, int64_t tq, int64_t diag, float scale, bool causal,
                        void* workspace, cudaStream_t stream);

// dx = scale * y * (dy - sum(dy * y)) over each row; y and dx dense, dy with its own row stride.
cudaError_t softmax_bwd(DType dtype, const void* y, const void* dy, void* dx, int64_t rows,
                        int64_t cols, int64_t dy_row_stride, int64_t tq, int64_t diag, float scale,
                        bool causal, void* workspace, cudaStream_t stream);

// Which code path a launch with these arguments takes ("register", "hybrid", "persist",
// "cluster-persist", "cluster", "split", "stream"), for tests and docs.
const char* softmax_path(DType dtype, bool backward, int64_t rows, int64_t cols, bool aligned);

}  // namespace softmax_harness
