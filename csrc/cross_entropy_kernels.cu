// Fused cross-entropy rows and the backward's gradient scale (CUDA C++, no torch header): the launch
// table and the dispatch. The code paths are listed in cross_entropy/paths.cuh (the kernels:
// cross_entropy/*.cuh, launched through cross_entropy/launch.cuh); cross_entropy_tuning*.cu build the
// variants this table is chosen from (`python -m harness.bench cuda-ce-sweep`).
//
// Bytes: every path but stream reads each logit once and writes each gradient element once (2 x the
// logits' bytes with a gradient, 1 x without; ignored rows are not read); the stream path reads twice.
#include "cross_entropy_kernels.h"

#include "cross_entropy/launch.cuh"

namespace softmax_harness {
namespace {

using namespace ce;

// ---------------------------------------------------------------------------------------------
// launch table: every knob of the cross-entropy launches is here. The hybrid and split rows come from
// the H200 sweep (harness/bench/tuning/cuda_ce_sweep.py; docs/perf.md); the register rows follow the softmax
// forward's table (the same row work: a max, a sum of exponentials, one store per element).
// ---------------------------------------------------------------------------------------------
// Register path, keyed by BLOCK_N (the next power of two >= V), the same elements per thread for every
// dtype: 32 up to 4096 columns (fewer for shorter rows), 16 at 8192, 64 at 16384 (fp32 exponentials
// kept), 16-bit rows of 16385-32768: 512 threads x 64 kept packed (32 registers of row data, a 64-register
// cap: two blocks per SM). Packed is a 16-bit choice only (fp32 rows keep their exponentials).
constexpr int reg_items(int block_n) { return block_n == 8192 ? 16 : block_n >= 16384 ? 64 : 32; }
constexpr bool reg_packed(int block_n) { return block_n > 16384; }
template <typename T>
constexpr int reg_max() {  // longest register row: 16-bit 32768, fp32 16384
  return sizeof(T) == 2 ? 32768 : 16384;
}
// Hybrid path (16-bit rows of reg_max + 1 ... kHybridMax columns, e.g. V = 50304): a block of 512 threads
// per row, 32 elements per thread in registers (packed) and 96 more in shared memory (96 KB: two blocks
// per SM). The H200 sweep at V = 50304 (docs/perf.md): 0.86 of copy, against 0.81 for 64 + 64 and 0.75
// for 64 + 40 (the table before the sweep): the more of the row the copy engine stages in shared
// memory, the more loads are in flight.
constexpr int kHybridThreads = 512, kHybridRegItems = 32, kHybridSmemItems = 96;
constexpr int64_t kHybridMax = (int64_t)kHybridThreads * (kHybridRegItems + kHybridSmemItems);
// Split path (longer rows, e.g. V = 128256 or 262144): slices of `threads` x (`items` in registers +
// `smem` in shared memory) columns, at most min(kMaxSplits, SMs) slices. 16-bit: 512 x (64 packed + 64),
// 64K-column slices (two at 128256, four at 262144): 0.81 / 0.79 of copy in the H200 sweep, against
// 0.62 / 0.60 for 256 x 64 (16K-column slices, the table before the sweep): fewer, larger slices wait
// less on each other. fp32: 256 x 32 in registers (exponentials kept; not swept).
template <typename T>
struct SplitShape {
  static constexpr bool b16 = sizeof(T) == 2;
  static constexpr int threads = b16 ? 512 : 256, items = b16 ? 64 : 32, smem = b16 ? 64 : 0;
  static constexpr bool packed = b16;
};
// Stream path (unaligned rows, and rows longer than the split path takes): a block of 512 threads per
// row (128 for unaligned rows of up to 2048 columns).
constexpr int kStreamThreads = 512, kStreamThreadsShort = 128;

// ---------------------------------------------------------------------------------------------
// dispatch
// ---------------------------------------------------------------------------------------------
enum class Path { Register, Hybrid, Split, Stream, None };

template <typename T>
SplitPlan plan_of(int64_t cols, bool forced) {
  using S = SplitShape<T>;
  return split_plan(cols, (int64_t)S::threads * (S::items + S::smem), vec_of<T>(),
                    forced && cols >= 2 * vec_of<T>() ? 2 : 1);
}

// The path for rows x cols (aligned: see is_aligned), the SM count for the split cap.
template <typename T>
Path choose_path(int64_t rows, int64_t cols, bool aligned, int force, int sms) {
  constexpr bool B16 = sizeof(T) == 2;
  switch (force) {
    case kCeRegister:
      return aligned && cols <= reg_max<T>() ? Path::Register : Path::None;
    case kCeHybrid:
      return aligned && B16 && cols <= kHybridMax ? Path::Hybrid : Path::None;
    case kCeSplit:
      return aligned && split_fits(rows, plan_of<T>(cols, true), sms) ? Path::Split : Path::None;
    case kCeStream:
      return Path::Stream;
    default:
      break;
  }
  if (!aligned) return Path::Stream;
  if (cols <= reg_max<T>()) return Path::Register;
  if (B16 && cols <= kHybridMax) return Path::Hybrid;
  if (split_fits(rows, plan_of<T>(cols, false), sms)) return Path::Split;
  return Path::Stream;
}

template <typename T>
bool is_aligned(const CeLaunch& a) {
  constexpr int VEC = vec_of<T>();
  bool ok = a.cols % VEC == 0 && aligned16(a.logits) && (a.rows <= 1 || a.logits_stride % VEC == 0);
  if (a.grad != nullptr) ok = ok && aligned16(a.grad) && (a.rows <= 1 || a.grad_stride % VEC == 0);
  return ok;
}

template <typename T>
cudaError_t launch_register_row(const CeParams& p, cudaStream_t s) {
  switch (next_pow2_at_least(p.cols, vec_of<T>())) {
#define REG_CASE(BN)                                                                         \
  case BN:                                                                                   \
    if constexpr (BN >= vec_of<T>() && BN <= reg_max<T>())                                   \
      return launch_register<T, BN, reg_items(BN), reg_packed(BN) && sizeof(T) == 2>(p, s);                    \
    break;
    REG_CASE(4) REG_CASE(8) REG_CASE(16) REG_CASE(32) REG_CASE(64) REG_CASE(128) REG_CASE(256) REG_CASE(512)
    REG_CASE(1024) REG_CASE(2048) REG_CASE(4096) REG_CASE(8192) REG_CASE(16384) REG_CASE(32768)
#undef REG_CASE
    default:
      break;
  }
  return cudaErrorInvalidConfiguration;
}

unsigned long long* error_word();

template <typename T>
cudaError_t dispatch(const CeLaunch& a) {
  constexpr int VEC = vec_of<T>();
  int sms = 0;
  cudaError_t err = sm_count(&sms);
  if (err != cudaSuccess) return err;
  const bool aligned = is_aligned<T>(a);
  const Path path = choose_path<T>(a.rows, a.cols, aligned, a.path, sms);
  CeParams p{};
  p.x = a.logits;
  p.g = a.grad;
  p.loss = a.loss;
  p.tgt = a.targets;
  p.scale = a.grad_scale;
  p.err = error_word();
  p.rows = a.rows;
  p.xs = a.rows > 1 ? a.logits_stride : a.cols;
  p.gs = a.rows > 1 ? a.grad_stride : a.cols;
  p.ignore = a.ignore_index;
  p.scale_stride = a.grad_scale_stride;
  p.cols = (int)a.cols;
  p.slice = (int)a.cols;
  if (p.err == nullptr) return cudaErrorUnknown;
  switch (path) {
    case Path::Register:
      return launch_register_row<T>(p, a.stream);
    case Path::Hybrid:
      if constexpr (sizeof(T) == 2) {
        static_assert(kHybridMax == 2 * reg_max<T>(), "hybrid rows: reg_max + 1 ... 2 x reg_max columns");
        return launch_hybrid<T, kHybridThreads, kHybridRegItems, kHybridSmemItems>(p, a.stream);
      }
      return cudaErrorInvalidConfiguration;
    case Path::Split: {
      using S = SplitShape<T>;
      return launch_split<T, S::threads, S::items, S::smem, S::packed>(p, plan_of<T>(a.cols, a.path == kCeSplit),
                                                                 a.workspace, a.stream);
    }
    case Path::Stream:
      if (!aligned) {
        if (a.cols <= 2048) return launch_stream<T, 1, kStreamThreadsShort>(p, a.stream);
        return launch_stream<T, 1, kStreamThreads>(p, a.stream);
      }
      return launch_stream<T, VEC, kStreamThreads>(p, a.stream);
    case Path::None:
      break;
  }
  return cudaErrorInvalidValue;  // a forced path that cannot take these rows
}

// The out-of-range target record: [first bad row + 1, its target, cols], one per device (a __device__
// variable of this module), its address asked once per device.
__device__ unsigned long long g_ce_error[3];

unsigned long long* error_word() {
  static std::atomic<unsigned long long*> cache[kMaxDevices];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return nullptr;
  unsigned long long* p = dev < kMaxDevices ? cache[dev].load(std::memory_order_relaxed) : nullptr;
  if (p == nullptr) {
    void* addr = nullptr;
    if (cudaGetSymbolAddress(&addr, g_ce_error) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    p = static_cast<unsigned long long*>(addr);
    if (dev < kMaxDevices) cache[dev].store(p, std::memory_order_relaxed);
  }
  return p;
}

template <typename F>
auto with_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::F16:
      return f(__half{});
    case DType::BF16:
      return f(__nv_bfloat16{});
    case DType::F32:
    default:
      return f(0.f);
  }
}

}  // namespace

int64_t ce_workspace_bytes(const CeLaunch& a) {
  if (a.rows <= 0 || a.cols <= 0 || a.cols > 0x7fffffff) return 0;
  return with_type(a.dtype, [&](auto t) -> int64_t {
    using T = decltype(t);
    int sms = 0;
    if (sm_count(&sms) != cudaSuccess) return 0;
    if (choose_path<T>(a.rows, a.cols, is_aligned<T>(a), a.path, sms) != Path::Split) return 0;
    return split_workspace_bytes(a.rows, plan_of<T>(a.cols, a.path == kCeSplit).splits);
  });
}

cudaError_t ce_rows(const CeLaunch& a) {
  if (a.rows <= 0) return cudaSuccess;
  if (a.cols <= 0 || a.cols > 0x7fffffff || a.rows > 0x7fffffff || a.loss == nullptr || a.targets == nullptr)
    return cudaErrorInvalidValue;
  if (a.grad != nullptr && a.grad == a.logits && a.grad_stride != a.logits_stride && a.rows > 1)
    return cudaErrorInvalidValue;  // in place needs the logits' own layout
  return with_type(a.dtype, [&](auto t) { return dispatch<decltype(t)>(a); });
}

const char* ce_path(DType dtype, int64_t rows, int64_t cols, bool aligned, int path) {
  int sms = 0;
  if (sm_count(&sms) != cudaSuccess) sms = kMaxSplits;
  const Path p = with_type(dtype, [&](auto t) { return choose_path<decltype(t)>(rows, cols, aligned, path, sms); });
  switch (p) {
    case Path::Register:
      return "register";
    case Path::Hybrid:
      return "hybrid";
    case Path::Split:
      return "split";
    case Path::Stream:
      return "stream";
    case Path::None:
      break;
  }
  return "none";
}

cudaError_t scale_grad(DType dtype, void* grad, int64_t rows, int64_t cols, int64_t row_stride, const float* s,
                       int64_t s_stride, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  if (s == nullptr || grad == nullptr) return cudaErrorInvalidValue;
  return with_type(dtype, [&](auto t) {
    using T = decltype(t);
    constexpr int VEC = vec_of<T>();
    T* g = static_cast<T*>(grad);
    const int64_t stride = rows > 1 ? row_stride : cols;
    if (aligned16(grad) && (rows == 1 || stride % VEC == 0)) return launch_scale<T, VEC, 256>(g, rows, cols, stride, s, s_stride, stream);
    return launch_scale<T, 1, 256>(g, rows, cols, stride, s, s_stride, stream);
  });
}

cudaError_t ce_take_error(bool* found, int64_t* row, int64_t* target, int64_t* cols) {
  *found = false;
  unsigned long long* word = error_word();
  if (word == nullptr) return cudaErrorUnknown;
  unsigned long long rec[3] = {0, 0, 0};
  cudaError_t err = cudaDeviceSynchronize();
  if (err == cudaSuccess) err = cudaMemcpy(rec, word, sizeof(rec), cudaMemcpyDeviceToHost);
  if (err != cudaSuccess) return err;
  if (rec[0] != 0) {
    *found = true;
    *row = (int64_t)rec[0] - 1;
    *target = (int64_t)rec[1];
    *cols = (int64_t)rec[2];
    const unsigned long long zero[3] = {0, 0, 0};
    err = cudaMemcpy(word, zero, sizeof(zero), cudaMemcpyHostToDevice);
  }
  return err;
}

}  // namespace softmax_harness
