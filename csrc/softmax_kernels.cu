// Fused scale + causal mask + softmax, forward and backward (CUDA C++, no torch header): the launch
// table and the dispatch. The kernels themselves are in softmax_device.cuh (see there for the code
// paths); softmax_tuning.cu times the variants this table was chosen from.
//
// Path by row length (N) and alignment:
//  * register (N <= reg_max): the row in registers, ITEMS elements per thread from the table below;
//  * cluster (N <= 16 CTAs x slice): long rows split over a Hopper thread-block cluster;
//  * stream: anything longer, and every unaligned row (two passes over global memory).
// Bytes: forward reads x once (its prefix, when causal) and writes y; backward reads y and dy (prefix)
// and writes dx into a fresh buffer (never into dy).
#include "softmax_kernels.h"

#include "softmax_device.cuh"

namespace softmax_harness {
namespace {

using namespace detail;

// ---------------------------------------------------------------------------------------------
// launch table: `python -m harness.bench cuda-sweep` on an H200 (bf16, rows x N = 2^27; docs/perf.md).
// Keyed by BLOCK_N (the next power of two >= N); the same elements per thread serve every dtype
// (fp32 rows then use more 16-byte vectors per thread, same registers).
// ---------------------------------------------------------------------------------------------
constexpr int fwd_items(int block_n) { return block_n <= 128 ? 8 : 16; }
constexpr bool fwd_merged(int block_n) { return block_n >= 8192; }  // else two reductions: max, then sum
constexpr bool fwd_packed(int) { return false; }  // 16-bit rows kept packed, exponentials computed twice
constexpr int bwd_items(int block_n) { return block_n <= 8192 ? 8 : 32; }
constexpr bool bwd_cap(int block_n) { return block_n >= 16384; }  // registers capped (see min_blocks)

// Longest rows one block keeps in registers, by element size (32 KB of 16-bit or 32-bit values).
template <typename T>
constexpr int reg_max() {
  return sizeof(T) == 2 ? 16384 : 8192;
}
// Cluster path: CTAs of kClusterThreads threads x kClusterItems elements, up to kMaxCluster of them
// (more than 8 is a non-portable cluster size, which Hopper allows); forward with the merged reduction
// and packed rows, backward with capped registers.
constexpr int kClusterThreads = 512, kClusterItems = 32, kMaxCluster = 16;
constexpr bool kClusterMerged = true, kClusterPacked = true, kClusterCap = true;

enum class Path { Register, Cluster, Stream };

template <typename T>
Path choose_path(int64_t cols, bool aligned) {
  if (!aligned) return Path::Stream;
  if (cols <= reg_max<T>()) return Path::Register;
  if (cols <= (int64_t)kMaxCluster * kClusterThreads * kClusterItems) return Path::Cluster;
  return Path::Stream;
}

// The launches of one direction: register path with the table's settings for BLOCK_N, cluster, stream.
template <typename T, bool BWD>
struct Launch {
  template <int BN>
  static cudaError_t reg(const Args& a) {
    if constexpr (BWD)
      return launch_bwd_register<T, BN, bwd_items(BN), bwd_cap(BN)>(a);
    else
      return launch_fwd_register<T, BN, fwd_items(BN), fwd_merged(BN), fwd_packed(BN)>(a);
  }
  static cudaError_t cluster(const Args& a) {
    if constexpr (BWD)
      return launch_bwd_cluster<T, kClusterThreads, kClusterItems, kClusterCap>(a);
    else
      return launch_fwd_cluster<T, kClusterThreads, kClusterItems, kClusterMerged, kClusterPacked>(a);
  }
  template <int VEC>
  static cudaError_t stream(const Args& a) {
    if constexpr (BWD)
      return launch_bwd_stream<T, VEC>(a);
    else
      return launch_fwd_stream<T, VEC>(a);
  }
};

template <typename T, bool BWD>
cudaError_t dispatch(const Args& a) {
  using Go = Launch<T, BWD>;
  constexpr int VEC = vec_of<T>();
  const bool aligned = is_aligned<T>(a, BWD);
  switch (choose_path<T>(a.cols, aligned)) {
    case Path::Register:
      switch (next_pow2_at_least(a.cols, VEC)) {
#define REG_CASE(BN)                                          \
  case BN:                                                    \
    if constexpr (BN >= vec_of<T>() && BN <= reg_max<T>()) \
      return Go::template reg<BN>(a);                         \
    break;
        REG_CASE(4) REG_CASE(8) REG_CASE(16) REG_CASE(32) REG_CASE(64) REG_CASE(128) REG_CASE(256)
        REG_CASE(512) REG_CASE(1024) REG_CASE(2048) REG_CASE(4096) REG_CASE(8192) REG_CASE(16384)
#undef REG_CASE
        default:
          break;
      }
      return cudaErrorInvalidConfiguration;
    case Path::Cluster: {
      const cudaError_t err = Go::cluster(a);
      if (err == cudaSuccess) return err;
      (void)cudaGetLastError();  // clear it: the stream path takes over (e.g. no non-portable clusters)
      break;
    }
    case Path::Stream:
      break;
  }
  return aligned ? Go::template stream<VEC>(a) : Go::template stream<1>(a);
}

}  // namespace

cudaError_t softmax_fwd(DType dtype, const void* x, void* y, int64_t rows, int64_t cols,
                        int64_t x_row_stride, int64_t tq, int64_t diag, float scale, bool causal,
                        cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  if (cols > 0x7fffffff || rows > 0x7fffffff) return cudaErrorInvalidValue;
  const Args a{x, nullptr, y, rows, cols, x_row_stride, tq < 1 ? 1 : tq, diag, scale, causal, stream};
  switch (dtype) {
    case DType::F32:
      return dispatch<float, false>(a);
    case DType::F16:
      return dispatch<__half, false>(a);
    case DType::BF16:
      return dispatch<__nv_bfloat16, false>(a);
  }
  return cudaErrorInvalidValue;
}

cudaError_t softmax_bwd(DType dtype, const void* y, const void* dy, void* dx, int64_t rows,
                        int64_t cols, int64_t dy_row_stride, int64_t tq, int64_t diag, float scale,
                        bool causal, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  if (cols > 0x7fffffff || rows > 0x7fffffff) return cudaErrorInvalidValue;
  const Args a{y, dy, dx, rows, cols, dy_row_stride, tq < 1 ? 1 : tq, diag, scale, causal, stream};
  switch (dtype) {
    case DType::F32:
      return dispatch<float, true>(a);
    case DType::F16:
      return dispatch<__half, true>(a);
    case DType::BF16:
      return dispatch<__nv_bfloat16, true>(a);
  }
  return cudaErrorInvalidValue;
}

const char* softmax_path(DType dtype, bool backward, int64_t cols, bool aligned) {
  (void)backward;  // forward and backward take the same path for the same row
  const Path p = dtype == DType::F32 ? choose_path<float>(cols, aligned) : choose_path<__half>(cols, aligned);
  switch (p) {
    case Path::Register:
      return "register";
    case Path::Cluster:
      return "cluster";
    case Path::Stream:
      return "stream";
  }
  return "stream";
}

}  // namespace softmax_harness
