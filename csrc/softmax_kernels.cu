// Fused scale + causal mask + softmax, forward and backward (CUDA C++, no torch header): the launch
// table and the dispatch. The code paths are listed in softmax/paths.cuh (the kernels: softmax/*.cuh,
// launched through softmax/launch.cuh); softmax_tuning*.cu time the variants this table was chosen from.
//
// Path by row length (N) and alignment (forward: for a normal, finite scale; any other takes the
// stream path, see fill_scale_ok):
//  * register: N <= reg_max, ITEMS elements per thread from the table below;
//  * hybrid: 16-bit forward, reg_max < N <= 2 * reg_max;
//  * persist: backward rows of up to 32 KB (persist_max) that the register path does not take (fp32);
//  * cluster-persist: fp32 forward, N <= 2 * persist_max (a cluster of two CTAs, half a row each);
//  * cluster: backward, N <= kBwdClusterMax slices of 32 KB;
//  * split: N <= kMaxSplits slices (needs the caller's workspace, softmax_workspace_bytes());
//  * stream: anything longer, and every unaligned row.
// Bytes: forward reads x once (its prefix, when causal) and writes y; backward reads y and dy (prefix)
// and writes dx into a fresh buffer (never into dy).
#include "softmax_kernels.h"

#include "softmax/launch.cuh"

#include <float.h>

namespace softmax_harness {
namespace {

using namespace detail;

// ---------------------------------------------------------------------------------------------
// launch table: `python -m harness.bench cuda-sweep` on an H200 (bf16, rows x N = 2^27; docs/perf.md).
// Keyed by BLOCK_N (the next power of two >= N); the same elements per thread serve every dtype
// (fp32 rows then use more 16-byte vectors per thread, same registers).
// ---------------------------------------------------------------------------------------------
// Forward register rows: up to 16384 columns 32 elements per thread (fewer when the row is shorter; 16
// at 4097-8192 columns, 64 at 8193-16384), two reductions (max, then sum: as fast as one merged
// reduction there, docs/perf.md), the exponentials kept in fp32; 16-bit rows of 16385-32768 columns: 1024 threads x 32
// elements kept packed (the loaded words: half the registers, two blocks per SM), the exponential
// computed twice, one merged reduction.
constexpr bool fwd_packed(int block_n) { return block_n > 16384; }  // (packed rows: merged too)
constexpr int fwd_items(int block_n) {
  return block_n == 8192 ? 16 : block_n < 8192 || fwd_packed(block_n) ? 32 : 64;
}
// Backward register rows: 8 elements per thread up to 8192 columns; 16-bit rows of 8193-32768 columns 32
// (512 or 1024 threads), except rows of 12289-16384 columns (over three quarters of their tile): 1024 x 16
// (cuda-sweep on an H100, docs/perf.md, GB/s: 12288 2997 against 2906 for 16 elements a thread; 16384 2998
// against 2986-2989 for 32; 32768 2971 against at most 2932 for the cluster path they took before).
constexpr int bwd_items(int block_n) { return block_n > 8192 ? 32 : 8; }
// ... and for rows over three quarters of their tile (a column of the same table; equal where unmeasured)
constexpr int bwd_items_full(int block_n) { return block_n == 16384 ? 16 : bwd_items(block_n); }
constexpr bool kBwdCap = false;     // ... with uncapped registers (see min_blocks)

// Longest rows one block keeps in registers: forward 32768 16-bit (packed) or 16384 fp32 columns,
// backward 32768 16-bit or 4096 fp32 columns (longer rows: the persistent path (fp32), then the cluster path).
template <typename T, bool BWD>
constexpr int reg_max() {
  return !BWD ? (sizeof(T) == 2 ? 32768 : 16384) : sizeof(T) == 2 ? 32768 : 4096;
}
// Hybrid path (16-bit forward rows of 32769-65536 columns): 512 threads x 64 elements in registers
// (packed) and 32 (up to 49152 columns) or 64 more in shared memory, a block per row, two blocks per SM
// (one's reduction overlaps the other's loads and stores); it replaced the persistent path (1024 x 64
// packed, the next row prefetched) for these rows (the measurements: docs/perf.md).
constexpr int kHybridThreads = 512, kHybridRegItems = 64;
// Persistent path, forward: fp32 rows over a cluster of two CTAs only (cluster-persist: 2 x 512
// threads x 32 elements, 64 KB each; 16-bit rows take the hybrid path). Backward: rows of up to 32 KB,
// 1024 threads, one buffer (y and dy of the next row); only fp32 rows (4097-8192 columns) take it, 16-bit
// rows of that size being faster in registers (measured on an H100, docs/perf.md).
template <typename T, bool BWD>
constexpr int persist_max() {
  return BWD ? 32768 / (int)sizeof(T) : 16384;
}
// Backward cluster path: CTAs of 512 threads holding 32 KB of the row (16384 16-bit or 8192 fp32
// columns), capped registers, up to kBwdClusterMax CTAs (a portable cluster size).
template <typename T>
constexpr int bwd_slice() {
  return 32768 / (int)sizeof(T);
}
constexpr int kBwdClusterMax = 8;

// Split path: slices of threads x items elements, up to kMaxSplits of them per row. Forward: 16-bit
// 512 x 32 kept packed, fp32 256 x 32, (max, sum) merged once per row; backward: 512 x 16 with capped
// registers.
template <typename T, bool BWD>
struct SplitShape {
  static constexpr int threads = BWD || sizeof(T) == 2 ? 512 : 256, items = BWD ? 16 : 32;
};
constexpr bool kSplitPacked = true, kSplitCap = true;

enum class Path { Register, Hybrid, Persist, ClusterPersist, Cluster, Split, Stream };

template <typename T, bool BWD>
Path choose_path(int64_t rows, int64_t cols, bool aligned) {
  if (!aligned) return Path::Stream;
  if (cols <= reg_max<T, BWD>()) return Path::Register;
  if (!BWD && sizeof(T) == 2 && cols <= 2 * reg_max<T, BWD>()) return Path::Hybrid;
  if (cols <= persist_max<T, BWD>()) return Path::Persist;
  if (!BWD && sizeof(T) == 4 && cols <= 2 * persist_max<T, BWD>()) return Path::ClusterPersist;
  if (BWD && cols <= (int64_t)kBwdClusterMax * bwd_slice<T>()) return Path::Cluster;
  if (split_fits(rows, cols, SplitShape<T, BWD>::threads, SplitShape<T, BWD>::items)) return Path::Split;
  return Path::Stream;
}

// The launches of one direction: register path with the table's settings for BLOCK_N, persistent
// (one CTA or a cluster of C per row), split, stream.
template <typename T, bool BWD>
struct Launch {
  template <int BN>
  static cudaError_t reg(const Args& a) {
    if constexpr (BWD) {
      if constexpr (bwd_items_full(BN) != bwd_items(BN))
        if (4 * a.cols > 3 * (int64_t)BN) return launch_bwd_register<T, BN, bwd_items_full(BN), kBwdCap>(a);
      return launch_bwd_register<T, BN, bwd_items(BN), kBwdCap>(a);
    } else
      return launch_fwd_register<T, BN, fwd_items(BN), fwd_packed(BN), fwd_packed(BN)>(a);
  }
  template <int BN, int C>
  static cudaError_t persist(const Args& a) {
    if constexpr (BWD)
      return launch_bwd_persist<T, 1024, BN / 1024, 1, C>(a);
    else
      return launch_fwd_persist<T, BN / 32, 32, 1, C, true, false>(a);
  }
  static cudaError_t hybrid(const Args& a) {
    static_assert(!BWD && sizeof(T) == 2, "the hybrid path is a 16-bit forward");
    constexpr int L = kHybridThreads, RI = kHybridRegItems;
    static_assert(L * RI == reg_max<T, BWD>(), "the registers hold the rows the register path cannot");
    if (a.cols <= (int64_t)L * (RI + 32)) return launch_fwd_hybrid<T, L, RI, 32>(a);
    return launch_fwd_hybrid<T, L, RI, 64>(a);
  }
  static cudaError_t cluster(const Args& a) {
    static_assert(BWD, "forward rows this long take the cluster-persist path");
    return launch_bwd_cluster<T, 512, bwd_slice<T>() / 512, true>(a);
  }
  static cudaError_t split(const Args& a) {
    if constexpr (BWD)
      return launch_bwd_split<T, SplitShape<T, true>::threads, SplitShape<T, true>::items, kSplitCap>(a);
    else
      return launch_fwd_split<T, SplitShape<T, false>::threads, SplitShape<T, false>::items, kSplitPacked>(a);
  }
  template <int VEC>
  static cudaError_t stream(const Args& a) {
    if constexpr (BWD)
      return launch_bwd_stream<T, VEC>(a);
    else
      return launch_fwd_stream<T, VEC>(a);
  }
};

// The forward's on-chip paths read masked columns as a fill whose scaled score is -inf (see fill_word),
// which needs a normal, finite c = scale * log2(e); any other scale (0, subnormal, inf, NaN) takes the
// stream path, which masks element by element.
inline bool fill_scale_ok(float scale) {
  const float c = fabsf(scale * kLog2e);
  return c >= FLT_MIN && c <= FLT_MAX;
}

template <typename T, bool BWD>
cudaError_t dispatch(const Args& a) {
  using Go = Launch<T, BWD>;
  constexpr int VEC = vec_of<T>();
  const bool aligned = is_aligned<T>(a, BWD);
  if (!BWD && !fill_scale_ok(a.scale)) return aligned ? Go::template stream<VEC>(a) : Go::template stream<1>(a);
  switch (choose_path<T, BWD>(a.rows, a.cols, aligned)) {
    case Path::Register:
      switch (next_pow2_at_least(a.cols, VEC)) {
#define REG_CASE(BN)                                                \
  case BN:                                                          \
    if constexpr (BN >= vec_of<T>() && BN <= reg_max<T, BWD>()) \
      return Go::template reg<BN>(a);                               \
    break;
        REG_CASE(4) REG_CASE(8) REG_CASE(16) REG_CASE(32) REG_CASE(64) REG_CASE(128) REG_CASE(256)
        REG_CASE(512) REG_CASE(1024) REG_CASE(2048) REG_CASE(4096) REG_CASE(8192) REG_CASE(16384) REG_CASE(32768)
#undef REG_CASE
        default:
          break;
      }
      return cudaErrorInvalidConfiguration;
    case Path::Persist:
      switch (next_pow2_at_least(a.cols, VEC)) {
#define PERSIST_CASE(BN)                                                                             \
  case BN:                                                                                           \
    if constexpr (BN > reg_max<T, BWD>() && BN <= persist_max<T, BWD>()) return Go::template persist<BN, 1>(a); \
    break;
        PERSIST_CASE(8192) PERSIST_CASE(16384) PERSIST_CASE(32768) PERSIST_CASE(65536)
#undef PERSIST_CASE
        default:
          break;
      }
      return cudaErrorInvalidConfiguration;
    case Path::Hybrid:
      if constexpr (!BWD && sizeof(T) == 2) return Go::hybrid(a);
      return cudaErrorInvalidConfiguration;
    case Path::ClusterPersist:
      if constexpr (!BWD) return Go::template persist<persist_max<T, BWD>(), 2>(a);
      return cudaErrorInvalidConfiguration;
    case Path::Cluster:
      if constexpr (BWD) return Go::cluster(a);
      return cudaErrorInvalidConfiguration;
    case Path::Split:
      return Go::split(a);
    case Path::Stream:
      break;
  }
  return aligned ? Go::template stream<VEC>(a) : Go::template stream<1>(a);
}

}  // namespace

cudaError_t softmax_fwd(DType dtype, const void* x, void* y, int64_t rows, int64_t cols,
                        int64_t x_row_stride, int64_t tq, int64_t diag, float scale, bool causal,
                        void* workspace, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  if (cols > 0x7fffffff || rows > 0x7fffffff) return cudaErrorInvalidValue;
  const Args a{x, nullptr, y, rows, cols, x_row_stride, tq < 1 ? 1 : tq, diag, scale, causal, stream, workspace};
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
                        bool causal, void* workspace, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  if (cols > 0x7fffffff || rows > 0x7fffffff) return cudaErrorInvalidValue;
  const Args a{y, dy, dx, rows, cols, dy_row_stride, tq < 1 ? 1 : tq, diag, scale, causal, stream, workspace};
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

namespace {
template <bool BWD>
Path path_of(DType dtype, int64_t rows, int64_t cols, bool aligned) {
  return dtype == DType::F32 ? choose_path<float, BWD>(rows, cols, aligned) : choose_path<__half, BWD>(rows, cols, aligned);
}

Path path_of(DType dtype, bool backward, int64_t rows, int64_t cols, bool aligned) {
  return backward ? path_of<true>(dtype, rows, cols, aligned) : path_of<false>(dtype, rows, cols, aligned);
}
}  // namespace

int64_t softmax_workspace_bytes(DType dtype, bool backward, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0 || path_of(dtype, backward, rows, cols, true) != Path::Split) return 0;  // (unaligned: none)
  auto bytes = [&](auto t) {
    using T = decltype(t);
    return backward ? split_workspace_bytes(rows, cols, SplitShape<T, true>::threads, SplitShape<T, true>::items)
                    : split_workspace_bytes(rows, cols, SplitShape<T, false>::threads, SplitShape<T, false>::items);
  };
  return dtype == DType::F32 ? bytes(0.f) : bytes(__half{});
}

const char* softmax_path(DType dtype, bool backward, int64_t rows, int64_t cols, bool aligned) {
  switch (path_of(dtype, backward, rows, cols, aligned)) {
    case Path::Register:
      return "register";
    case Path::Hybrid:
      return "hybrid";
    case Path::Persist:
      return "persist";
    case Path::ClusterPersist:
      return "cluster-persist";
    case Path::Cluster:
      return "cluster";
    case Path::Split:
      return "split";
    case Path::Stream:
      return "stream";
  }
  return "stream";
}

}  // namespace softmax_harness
