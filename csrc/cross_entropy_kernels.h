// Fused cross-entropy rows and the backward's gradient scale: the launchers' interface.
// Plain CUDA C++: no torch header, so `nvcc -c csrc/cross_entropy_kernels.cu` builds it anywhere (CI does).
// What the kernels compute and their code paths: csrc/cross_entropy/paths.cuh.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "softmax_kernels.h"  // DType

namespace softmax_harness {

// Forced code paths (tests): the launch table's choice (kAuto), or one path with the table's shape for
// it (an error when that path cannot take the row: a register row longer than the register path's
// longest, a hybrid row of another dtype or too long, an unaligned row on any path but stream). A
// forced split cuts every row into at least two slices (when it has two vectors' worth of columns).
enum CePath : int { kCeAuto = -1, kCeRegister = 0, kCeHybrid = 1, kCeSplit = 2, kCeStream = 3 };

struct CeLaunch {
  DType dtype;
  const void* logits;        // (rows, cols), element (r, c) at logits + r * logits_stride + c
  int64_t logits_stride;
  void* grad;                // (rows, cols) at grad + r * grad_stride + c in the logits' dtype, or nullptr
  int64_t grad_stride;       // (grad may be logits itself, with the same stride: the gradient in place)
  float* loss;               // (rows,) fp32
  const int64_t* targets;    // (rows,)
  int64_t ignore_index;
  const float* grad_scale;   // nullptr (1), a device scalar (grad_scale_stride 0) or (rows,) (stride 1)
  int64_t grad_scale_stride;
  int64_t rows, cols;        // rows, cols < 2^31
  int path;                  // CePath
  void* workspace;           // ce_workspace_bytes(*this) bytes, 16-byte aligned (untouched until the launch ran)
  cudaStream_t stream;
};

// Bytes of device workspace a launch needs (0 unless it takes the split path).
int64_t ce_workspace_bytes(const CeLaunch& a);

// Per row: loss = logsumexp(x) - x[t] (0 if t == ignore_index) and, with a gradient buffer,
// grad = (softmax(x) - onehot(t)) * s (0 if ignored). Out-of-range targets: NaN loss and gradient row, and
// the first one recorded on the device (ce_take_error). Launched on a.stream; no host sync.
cudaError_t ce_rows(const CeLaunch& a);

// The code path ce_rows takes ("register", "hybrid", "split", "stream"), for tests and docs; `aligned`:
// the rows meet the vector paths' alignment (ce_rows checks the pointers and strides itself).
const char* ce_path(DType dtype, int64_t rows, int64_t cols, bool aligned, int path);

// grad (rows, cols) *= s in place, s a device fp32 scalar (s_stride 0) or one per row (s_stride 1); each
// block reads its s and returns at once when it is exactly 1. Any alignment; cols may exceed 2^31.
cudaError_t scale_grad(DType dtype, void* grad, int64_t rows, int64_t cols, int64_t row_stride, const float* s,
                       int64_t s_stride, cudaStream_t stream);

// The first out-of-range target any ce_rows launch on the current device recorded since the last call:
// returns true and its row, target and cols (and clears the record), or false. Synchronizes the device:
// for debugging and tests, never on the hot path.
cudaError_t ce_take_error(bool* found, int64_t* row, int64_t* target, int64_t* cols);

}  // namespace softmax_harness
