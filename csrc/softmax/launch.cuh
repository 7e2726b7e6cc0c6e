// Host side of the fused softmax kernels: the launchers (grids, cluster and persistent launches, the
// occupancy and shared-memory queries, the split workspace, alignment checks), shared by the
// production dispatch (softmax_kernels.cu) and the tuning variants (softmax_tuning*.cu). Included
// by .cu files only; the kernels it launches, and the code paths: paths.cuh.
#pragma once

#include "paths.cuh"

#include <cuda_runtime.h>
#include <stdint.h>

#include <atomic>

namespace softmax_harness {
namespace detail {

template <typename T>
constexpr int vec_of() {
  return 16 / (int)sizeof(T);
}

struct Args {
  const void* a;  // x (forward) or y (backward)
  const void* b;  // dy (backward)
  void* out;
  int64_t rows, cols, stride, tq, diag;
  float scale;
  bool causal;
  cudaStream_t stream;
  void* workspace;  // split path only: split_workspace_bytes() bytes
};

// Register-path shape for rows of up to BLOCK_N columns with about ITEMS_WANT elements per thread
// (at least one 16-byte vector, at most the whole row): L threads per row; L <= 32 packs 256 / L rows
// into a block, L > 32 is one row per block (the block-wide reductions assume it).
template <typename T, int BLOCK_N, int ITEMS_WANT>
struct RegShape {
  static constexpr int VEC = vec_of<T>();
  static constexpr int ITEMS0 = ITEMS_WANT < VEC ? VEC : ITEMS_WANT;
  static constexpr int ITEMS = ITEMS0 > BLOCK_N ? BLOCK_N : ITEMS0;
  static constexpr int NV = ITEMS / VEC;
  static constexpr int L = BLOCK_N / ITEMS;
  static constexpr int ROWS = L > 32 ? 1 : 256 / L;
  static_assert(ITEMS % VEC == 0 && L * ITEMS == BLOCK_N && L * ROWS <= 1024, "bad register config");
};

template <typename T, int BLOCK_N, int ITEMS_WANT, bool MERGED, bool PACKED>
cudaError_t launch_fwd_register(const Args& a) {
  using C = RegShape<T, BLOCK_N, ITEMS_WANT>;
  const int64_t blocks = (a.rows + C::ROWS - 1) / C::ROWS;
  fwd_register_kernel<T, C::VEC, C::NV, C::L, C::ROWS, MERGED, PACKED && sizeof(T) == 2, kBlock>
      <<<(unsigned)blocks, C::L * C::ROWS, 0, a.stream>>>(static_cast<const T*>(a.a), static_cast<T*>(a.out),
                                                         a.rows, (int)a.cols, a.stride, a.tq, a.diag,
                                                         a.scale * kLog2e, a.causal, SplitWs{});
  return cudaGetLastError();
}

template <typename T, int BLOCK_N, int ITEMS_WANT, bool CAP>
cudaError_t launch_bwd_register(const Args& a) {
  using C = RegShape<T, BLOCK_N, ITEMS_WANT>;
  const int64_t blocks = (a.rows + C::ROWS - 1) / C::ROWS;
  bwd_register_kernel<T, C::VEC, C::NV, C::L, C::ROWS, kBlock, CAP><<<(unsigned)blocks, C::L * C::ROWS, 0, a.stream>>>(
      static_cast<const T*>(a.a), static_cast<const T*>(a.b), static_cast<T*>(a.out), a.rows, (int)a.cols,
      a.stride, a.tq, a.diag, a.scale, a.causal, SplitWs{});
  return cudaGetLastError();
}

inline cudaLaunchConfig_t cluster_config(const Args& a, int threads, int n_ctas, cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)(a.rows * n_ctas));
  cfg.blockDim = dim3((unsigned)threads);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = a.stream;
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = (unsigned)n_ctas;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

template <typename Kernel>
cudaError_t allow_cluster(Kernel kernel, int n_ctas) {
  if (n_ctas <= 8) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
}

// Columns one CTA of a cluster covers, and the CTAs a row needs.
inline int ctas_for(int64_t cols, int threads, int items) {
  return (int)((cols + (int64_t)threads * items - 1) / ((int64_t)threads * items));
}

// One row per cluster of ceil(cols / (threads * items)) CTAs.
template <typename Kernel, typename... KernelArgs>
cudaError_t launch_cluster(Kernel kernel, const Args& a, int threads, int items, KernelArgs... args) {
  const int n_ctas = ctas_for(a.cols, threads, items);
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t cfg = cluster_config(a, threads, n_ctas, attr);
  cudaError_t err = allow_cluster(kernel, n_ctas);
  if (err == cudaSuccess) err = cudaLaunchKernelEx(&cfg, kernel, args...);
  return err;
}

template <typename T, int L, int ITEMS, bool PACKED>
cudaError_t launch_fwd_cluster(const Args& a) {
  constexpr int VEC = vec_of<T>();
  static_assert(ITEMS % VEC == 0, "bad cluster config");
  return launch_cluster(fwd_register_kernel<T, VEC, ITEMS / VEC, L, 1, true, PACKED && sizeof(T) == 2, kCluster>,
                        a, L, ITEMS, static_cast<const T*>(a.a), static_cast<T*>(a.out), a.rows, (int)a.cols,
                        a.stride, a.tq, a.diag, a.scale * kLog2e, a.causal, SplitWs{});
}

template <typename T, int L, int ITEMS, bool CAP>
cudaError_t launch_bwd_cluster(const Args& a) {
  constexpr int VEC = vec_of<T>();
  static_assert(ITEMS % VEC == 0, "bad cluster config");
  return launch_cluster(bwd_register_kernel<T, VEC, ITEMS / VEC, L, 1, kCluster, CAP>, a, L, ITEMS,
                        static_cast<const T*>(a.a), static_cast<const T*>(a.b), static_cast<T*>(a.out), a.rows,
                        (int)a.cols, a.stride, a.tq, a.diag, a.scale, a.causal, SplitWs{});
}

// Split path: rows of up to kMaxSplits slices of L threads x ITEMS elements; the workspace holds the
// counters (zeroed here, on the stream) and the partials.
constexpr int kMaxSplits = 128;

inline int64_t split_counter_bytes(int64_t rows) { return ((rows + 1) * 4 + 15) / 16 * 16; }

inline int64_t split_workspace_bytes(int64_t rows, int64_t cols, int threads, int items) {
  return split_counter_bytes(rows) + rows * ctas_for(cols, threads, items) * (int64_t)sizeof(float2);
}

inline bool split_fits(int64_t rows, int64_t cols, int threads, int items) {
  const int64_t n = ctas_for(cols, threads, items);
  return n >= 1 && n <= kMaxSplits && rows * n < 0x7fffffff;
}

template <typename Kernel, typename... KernelArgs>
cudaError_t launch_split(Kernel kernel, const Args& a, int threads, int items, KernelArgs... args) {
  if (!split_fits(a.rows, a.cols, threads, items) || a.workspace == nullptr) return cudaErrorInvalidValue;
  const int splits = ctas_for(a.cols, threads, items);
  char* ws = static_cast<char*>(a.workspace);
  cudaError_t err = cudaMemsetAsync(ws, 0, (size_t)split_counter_bytes(a.rows), a.stream);
  if (err != cudaSuccess) return err;
  const SplitWs w{reinterpret_cast<unsigned*>(ws), reinterpret_cast<float2*>(ws + split_counter_bytes(a.rows)), splits};
  kernel<<<(unsigned)(a.rows * splits), threads, 0, a.stream>>>(args..., w);
  return cudaGetLastError();
}

template <typename T, int L, int ITEMS, bool PACKED>
cudaError_t launch_fwd_split(const Args& a) {
  constexpr int VEC = vec_of<T>();
  static_assert(ITEMS % VEC == 0, "bad split config");
  return launch_split(fwd_register_kernel<T, VEC, ITEMS / VEC, L, 1, true, PACKED && sizeof(T) == 2, kSplit>, a, L,
                      ITEMS, static_cast<const T*>(a.a), static_cast<T*>(a.out), a.rows, (int)a.cols, a.stride,
                      a.tq, a.diag, a.scale * kLog2e, a.causal);
}

template <typename T, int L, int ITEMS, bool CAP>
cudaError_t launch_bwd_split(const Args& a) {
  constexpr int VEC = vec_of<T>();
  static_assert(ITEMS % VEC == 0, "bad split config");
  return launch_split(bwd_register_kernel<T, VEC, ITEMS / VEC, L, 1, kSplit, CAP>, a, L, ITEMS,
                      static_cast<const T*>(a.a), static_cast<const T*>(a.b), static_cast<T*>(a.out), a.rows,
                      (int)a.cols, a.stride, a.tq, a.diag, a.scale, a.causal);
}

// Persistent path: rows of up to C * L * ITEMS columns (C CTAs per row: a thread-block cluster when
// C > 1), B row buffers of shared memory, as many blocks (clusters) as fit on the GPU at once, or one
// per row when there are fewer rows. What fits is asked once per kernel and device (the shared-memory
// opt-in, SM count and occupancy queries are host calls) and kept in the launcher's `resident` table,
// counted in blocks for C == 1 and in clusters otherwise.
constexpr int kMaxDevices = 64;

inline cudaLaunchConfig_t persist_config(int64_t blocks, int threads, size_t smem, int n_ctas, cudaStream_t stream,
                                         cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)blocks);
  cfg.blockDim = dim3((unsigned)threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = (unsigned)n_ctas;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = n_ctas > 1 ? 1 : 0;
  return cfg;
}

template <typename Kernel>
cudaError_t persist_grid(Kernel kernel, int threads, size_t smem, int n_ctas, int64_t rows, std::atomic<int>* resident,
                         int64_t* grid) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  int fit = dev < kMaxDevices ? resident[dev].load(std::memory_order_relaxed) : 0;
  if (fit == 0) {
    int sms = 0, per_sm = 0;
    err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (err == cudaSuccess)  // (always: with the static shared memory, even < 48 KB dynamic may need it)
      err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err == cudaSuccess) err = allow_cluster(kernel, n_ctas);
    if (err == cudaSuccess) {
      if (n_ctas == 1) {
        err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem);
        fit = sms * per_sm;
      } else {
        cudaLaunchAttribute attr[1];
        const cudaLaunchConfig_t cfg = persist_config((int64_t)sms / n_ctas * n_ctas, threads, smem, n_ctas, nullptr, attr);
        err = cudaOccupancyMaxActiveClusters(&fit, kernel, &cfg);
      }
    }
    if (err != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky: clear it, so the caller's next CUDA call does not report it
      return err;
    }
    if (fit < 1) return cudaErrorInvalidConfiguration;
    if (dev < kMaxDevices) resident[dev].store(fit, std::memory_order_relaxed);
  }
  *grid = (rows < (int64_t)fit ? rows : (int64_t)fit) * n_ctas;
  return cudaSuccess;
}

template <typename Kernel, typename... KernelArgs>
cudaError_t launch_persist(Kernel kernel, const Args& a, int threads, size_t smem, int n_ctas,
                           std::atomic<int>* resident, KernelArgs... args) {
  int64_t grid = 0;
  cudaError_t err = persist_grid(kernel, threads, smem, n_ctas, a.rows, resident, &grid);
  if (err != cudaSuccess) return err;
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t cfg = persist_config(grid, threads, smem, n_ctas, a.stream, attr);
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}

template <typename T, int L, int ITEMS, int B, int C = 1, bool MERGED = false, bool PACKED = false>
cudaError_t launch_fwd_persist(const Args& a) {
  constexpr int VEC = vec_of<T>(), NV = ITEMS / VEC;
  static_assert(ITEMS % VEC == 0, "bad persist config");
  if (a.cols > (int64_t)C * L * ITEMS) return cudaErrorInvalidValue;
  static std::atomic<int> resident[kMaxDevices];
  return launch_persist(fwd_persist_kernel<T, VEC, NV, L, B, C, MERGED, PACKED && sizeof(T) == 2>, a, L,
                        (size_t)B * NV * L * 16, C, resident, static_cast<const T*>(a.a), static_cast<T*>(a.out),
                        a.rows, (int)a.cols, a.stride, a.tq, a.diag, a.scale * kLog2e, a.causal);
}

// Hybrid path (forward, 16-bit): RI elements per thread in registers and SI in shared memory, a block
// per row; the shared-memory opt-in asked once per device.
template <typename T, int L, int RI, int SI>
cudaError_t launch_fwd_hybrid(const Args& a) {
  constexpr int VEC = vec_of<T>();
  static_assert(RI % VEC == 0 && SI % VEC == 0, "bad hybrid config");
  if (a.cols <= (int64_t)L * RI || a.cols > (int64_t)L * (RI + SI) || a.rows > INT32_MAX) return cudaErrorInvalidValue;
  auto kernel = fwd_hybrid_kernel<T, VEC, RI / VEC, SI / VEC, L>;
  const size_t smem = (size_t)SI / VEC * L * 16;
  static std::atomic<int> opted[kMaxDevices];
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev >= kMaxDevices || !opted[dev].load(std::memory_order_relaxed)) {
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess) return err;
    if (dev < kMaxDevices) opted[dev].store(1, std::memory_order_relaxed);
  }
  kernel<<<(unsigned)a.rows, L, smem, a.stream>>>(static_cast<const T*>(a.a), static_cast<T*>(a.out), (int)a.cols,
                                                  a.stride, a.tq, a.diag, a.scale * kLog2e, a.causal);
  return cudaGetLastError();
}

template <typename T, int L, int ITEMS, int B, int C = 1>
cudaError_t launch_bwd_persist(const Args& a) {
  constexpr int VEC = vec_of<T>(), NV = ITEMS / VEC;
  static_assert(ITEMS % VEC == 0, "bad persist config");
  if (a.cols > (int64_t)C * L * ITEMS) return cudaErrorInvalidValue;
  static std::atomic<int> resident[kMaxDevices];
  return launch_persist(bwd_persist_kernel<T, VEC, NV, L, B, C>, a, L, (size_t)B * 2 * NV * L * 16, C, resident,
                        static_cast<const T*>(a.a), static_cast<const T*>(a.b), static_cast<T*>(a.out), a.rows,
                        (int)a.cols, a.stride, a.tq, a.diag, a.scale, a.causal);
}

template <typename T, int VEC>
cudaError_t launch_fwd_stream(const Args& a) {
  fwd_stream_kernel<T, VEC><<<(unsigned)a.rows, kStreamThreads, 0, a.stream>>>(
      static_cast<const T*>(a.a), static_cast<T*>(a.out), (int)a.cols, a.stride, a.tq, a.diag,
      a.scale * kLog2e, a.causal);
  return cudaGetLastError();
}

template <typename T, int VEC>
cudaError_t launch_bwd_stream(const Args& a) {
  bwd_stream_kernel<T, VEC><<<(unsigned)a.rows, kStreamThreads, 0, a.stream>>>(
      static_cast<const T*>(a.a), static_cast<const T*>(a.b), static_cast<T*>(a.out), (int)a.cols, a.stride,
      a.tq, a.diag, a.scale, a.causal);
  return cudaGetLastError();
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <typename T>
bool is_aligned(const Args& a, bool backward) {
  constexpr int VEC = vec_of<T>();
  bool ok = a.cols % VEC == 0 && a.stride % VEC == 0 && aligned16(a.a) && aligned16(a.out);
  if (backward) ok = ok && aligned16(a.b);
  return ok;
}

inline int next_pow2_at_least(int64_t n, int lo) {
  int b = lo;
  while (b < n) b <<= 1;
  return b;
}

}  // namespace detail
}  // namespace softmax_harness
