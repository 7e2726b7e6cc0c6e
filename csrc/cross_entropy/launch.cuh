// Host side of the fused cross-entropy kernels: the launchers (grids, the split plan and workspace, the
// shared-memory opt-in, the SM count), shared by the production dispatch (cross_entropy_kernels.cu) and
// the tuning variants (cross_entropy_tuning*.cu). Included by .cu files only; the kernels it launches,
// and the code paths: paths.cuh.
#pragma once

#include "paths.cuh"

#include <cuda_runtime.h>
#include <stdint.h>

#include <atomic>

namespace softmax_harness {
namespace ce {

constexpr int kMaxDevices = 64;
// Split path: at most this many slices per row, and never more than the GPU's SMs (every slice of a
// row must be able to run at once: at least one block of any kernel fits on an SM).
constexpr int kMaxSplits = 128;

template <typename T>
constexpr int vec_of() {
  return 16 / (int)sizeof(T);
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

inline int next_pow2_at_least(int64_t n, int lo) {
  int b = lo;
  while (b < n) b <<= 1;
  return b;
}

// SMs of the current device (asked once per device).
inline cudaError_t sm_count(int* sms) {
  static std::atomic<int> cache[kMaxDevices];
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  int n = dev < kMaxDevices ? cache[dev].load(std::memory_order_relaxed) : 0;
  if (n == 0) {
    err = cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
    if (err != cudaSuccess) return err;
    if (dev < kMaxDevices) cache[dev].store(n, std::memory_order_relaxed);
  }
  *sms = n;
  return cudaSuccess;
}

// The dynamic shared-memory opt-in of a kernel, once per device (hybrid kernels: 32-128 KB).
template <typename Kernel>
cudaError_t allow_smem(Kernel kernel, size_t smem, std::atomic<int>* opted) {
  if (smem <= 48 * 1024) return cudaSuccess;
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev < kMaxDevices && opted[dev].load(std::memory_order_relaxed)) return cudaSuccess;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (err == cudaSuccess && dev < kMaxDevices) opted[dev].store(1, std::memory_order_relaxed);
  return err;
}

// Register path: rows of up to BLOCK_N columns, about ITEMS_WANT elements per thread (at least a vector,
// at most the row): L threads per row; L <= 32 packs 256 / L rows into a block, else a block per row.
template <typename T, int BLOCK_N, int ITEMS_WANT>
struct RegShape {
  static constexpr int VEC = vec_of<T>();
  static constexpr int ITEMS0 = ITEMS_WANT < VEC ? VEC : ITEMS_WANT;
  static constexpr int ITEMS = ITEMS0 > BLOCK_N ? BLOCK_N : ITEMS0;
  static constexpr int NR = ITEMS / VEC;
  static constexpr int L = BLOCK_N / ITEMS;
  static constexpr int ROWS = L > 32 ? 1 : 256 / L;
  static_assert(ITEMS % VEC == 0 && L * ITEMS == BLOCK_N && L * ROWS <= 1024, "bad register config");
};

template <typename T, int BLOCK_N, int ITEMS_WANT, bool PACKED>
cudaError_t launch_register(const CeParams& p, cudaStream_t stream) {
  using C = RegShape<T, BLOCK_N, ITEMS_WANT>;
  if (p.cols > BLOCK_N) return cudaErrorInvalidValue;
  CeParams q = p;
  q.slice = p.cols;
  const int64_t blocks = (p.rows + C::ROWS - 1) / C::ROWS;
  ce_rows_kernel<T, C::VEC, C::NR, 0, C::L, C::ROWS, PACKED, false>
      <<<(unsigned)blocks, C::L * C::ROWS, 0, stream>>>(q, SplitWs{});
  return cudaGetLastError();
}

// Hybrid path: a block of L threads per row, RI elements per thread in registers and SI in shared memory.
template <typename T, int L, int RI, int SI>
cudaError_t launch_hybrid(const CeParams& p, cudaStream_t stream) {
  constexpr int VEC = vec_of<T>();
  static_assert(RI % VEC == 0 && SI % VEC == 0 && SI > 0, "bad hybrid config");
  if (p.cols > (int64_t)L * (RI + SI)) return cudaErrorInvalidValue;
  auto kernel = ce_rows_kernel<T, VEC, RI / VEC, SI / VEC, L, 1, true, false>;
  const size_t smem = (size_t)(SI / VEC) * L * 16;
  static std::atomic<int> opted[kMaxDevices];
  cudaError_t err = allow_smem(kernel, smem, opted);
  if (err != cudaSuccess) return err;
  CeParams q = p;
  q.slice = p.cols;
  kernel<<<(unsigned)p.rows, L, smem, stream>>>(q, SplitWs{});
  return cudaGetLastError();
}

// Split path: `splits` slices of `slice` columns per row (balanced: ceil(cols / splits) rounded up to
// the vector width), each on a block of L threads holding up to L * (RI + SI) columns.
struct SplitPlan {
  int splits, slice;
};

inline SplitPlan split_plan(int64_t cols, int64_t capacity, int vec, int min_splits) {
  int64_t n = (cols + capacity - 1) / capacity;
  if (n < min_splits) n = min_splits;
  int64_t slice = (cols + n - 1) / n;
  slice = (slice + vec - 1) / vec * vec;
  n = (cols + slice - 1) / slice;
  return SplitPlan{(int)n, (int)slice};
}

inline int64_t split_counter_bytes(int64_t rows) { return ((rows + 1) * 4 + 15) / 16 * 16; }

inline int64_t split_workspace_bytes(int64_t rows, int splits) {
  return split_counter_bytes(rows) + rows * splits * (int64_t)sizeof(float2);
}

// Whether the plan may run: every slice of a row resident at once (splits <= min(kMaxSplits, SMs)).
inline bool split_fits(int64_t rows, const SplitPlan& plan, int sms) {
  const int cap = sms < kMaxSplits ? sms : kMaxSplits;
  return plan.splits >= 1 && plan.splits <= cap && rows * plan.splits < 0x7fffffff;
}

template <typename T, int L, int RI, int SI, bool PACKED>
cudaError_t launch_split(const CeParams& p, const SplitPlan& plan, void* workspace, cudaStream_t stream) {
  constexpr int VEC = vec_of<T>();
  static_assert(RI % VEC == 0 && SI % VEC == 0, "bad split config");
  int sms = 0;
  cudaError_t err = sm_count(&sms);
  if (err != cudaSuccess) return err;
  if (workspace == nullptr || !split_fits(p.rows, plan, sms) || plan.slice % VEC != 0 ||
      plan.slice > L * (RI + SI) || (int64_t)plan.slice * plan.splits < p.cols)
    return cudaErrorInvalidValue;
  auto kernel = ce_rows_kernel<T, VEC, RI / VEC, SI / VEC, L, 1, (PACKED || SI > 0), true>;
  const size_t smem = (size_t)(SI / VEC) * L * 16;
  static std::atomic<int> opted[kMaxDevices];
  err = allow_smem(kernel, smem, opted);
  if (err != cudaSuccess) return err;
  char* ws = static_cast<char*>(workspace);
  err = cudaMemsetAsync(ws, 0, (size_t)split_counter_bytes(p.rows), stream);
  if (err != cudaSuccess) return err;
  const SplitWs w{reinterpret_cast<unsigned*>(ws), reinterpret_cast<float2*>(ws + split_counter_bytes(p.rows)),
                  plan.splits};
  CeParams q = p;
  q.slice = plan.slice;
  kernel<<<(unsigned)(p.rows * plan.splits), L, smem, stream>>>(q, w);
  return cudaGetLastError();
}

template <typename T, int VEC, int THREADS>
cudaError_t launch_stream(const CeParams& p, cudaStream_t stream) {
  CeParams q = p;
  q.slice = p.cols;
  ce_stream_kernel<T, VEC, THREADS><<<(unsigned)p.rows, THREADS, 0, stream>>>(q);
  return cudaGetLastError();
}

// grad (rows, cols) *= s: a grid-stride loop over tiles, at most 8 blocks per SM.
template <typename T, int VEC, int THREADS>
cudaError_t launch_scale(T* g, int64_t rows, int64_t cols, int64_t stride, const float* s, int64_t s_stride,
                         cudaStream_t stream) {
  int sms = 0;
  cudaError_t err = sm_count(&sms);
  if (err != cudaSuccess) return err;
  const int64_t tile = ScaleTile<THREADS, VEC>::TILE;
  const int64_t per_row = (cols + tile - 1) / tile;
  int64_t grid = rows * per_row;
  if (grid > (int64_t)sms * 8) grid = (int64_t)sms * 8;
  scale_grad_kernel<T, VEC, THREADS><<<(unsigned)grid, THREADS, 0, stream>>>(g, rows, cols, stride, s, s_stride, per_row);
  return cudaGetLastError();
}

}  // namespace ce
}  // namespace softmax_harness
