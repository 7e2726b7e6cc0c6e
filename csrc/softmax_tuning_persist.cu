// The persistent-path launch variants (path 3 of softmax_tuning.h), in their own translation unit so
// the sweep's extension compiles them in parallel with the others.
#include "softmax_tuning.h"

#include "softmax/launch.cuh"

namespace softmax_harness {
namespace {

using namespace detail;
using tuning::with_bool;
using tuning::with_int;
using T = __nv_bfloat16;

#define V(x) std::decay_t<decltype(x)>::value

// Persistent shapes: `ctas` CTAs of `threads` x `items` per row, for rows longer than half of that (so
// each shape serves one range of N), `buffers` rows in shared memory (<= 227 KB: the launch says so
// otherwise). One CTA: 512 or 1024 threads x 16, 32 or 64 elements; clusters of 2 CTAs: 16, 32 or 64
// elements (64: packed rows only, as for one CTA), of 4 or 8 CTAs: 16 or 32 elements.
template <typename F>
cudaError_t with_persist_shape(int64_t cols, int threads, int items, int buffers, int ctas, F&& f) {
  const int64_t span = (int64_t)ctas * threads * items;
  if (cols > span || 2 * cols <= span) return cudaErrorNotSupported;
  return with_int<1, 2, 4, 8>(ctas, [&](auto c) {
    return with_int<512, 1024>(threads, [&](auto l) {
      return with_int<16, 32, 64>(items, [&](auto it) {
        return with_int<1, 2, 3>(buffers, [&](auto b) {
          if constexpr (V(c) > 2 && V(it) > 32)
            return cudaErrorNotSupported;
          else
            return f(c, l, it, b);
        });
      });
    });
  });
}

}  // namespace

cudaError_t tuned_fwd_persist(const void* x, void* y, int64_t rows, int64_t cols, int items, bool merged,
                              bool packed, int threads, int buffers, int ctas, cudaStream_t stream) {
  const Args a{x, nullptr, y, rows, cols, cols, 1, 0, 1.f, false, stream, nullptr};
  if (rows <= 0 || !is_aligned<T>(a, false)) return cudaErrorNotSupported;
  return with_persist_shape(cols, threads, items, buffers, ctas, [&](auto c, auto l, auto it, auto b) {
    return with_bool(merged, [&](auto m) {
      return with_bool(packed, [&](auto p) {
        if constexpr ((V(c) > 1 && !V(m)) || (V(it) > 32 && !V(p)) || (V(p) && !V(m)))
          return cudaErrorNotSupported;  // clusters merge; 64 elements only packed; packed only merged
        else
          return launch_fwd_persist<T, V(l), V(it), V(b), V(c), V(m), V(p)>(a);
      });
    });
  });
}

cudaError_t tuned_fwd_hybrid(const void* x, void* y, int64_t rows, int64_t cols, int items, int threads,
                             cudaStream_t stream) {
  const Args a{x, nullptr, y, rows, cols, cols, 1, 0, 1.f, false, stream, nullptr};
  if (rows <= 0 || !is_aligned<T>(a, false) || threads <= 0 || cols <= (int64_t)threads * items)
    return cudaErrorNotSupported;
  const int64_t per_thread = (cols + threads - 1) / threads;
  const int shared = (int)((per_thread - items + 31) / 32 * 32);  // the rest of the row, in steps of 32
  // 512 x 64 (the table's shape) and 512 x 32 and 256 x 64 for rows of 32769-65536 columns
  if (threads == 512 && items == 64 && shared <= 64)
    return shared <= 32 ? launch_fwd_hybrid<T, 512, 64, 32>(a) : launch_fwd_hybrid<T, 512, 64, 64>(a);
  if (threads == 512 && items == 32 && shared <= 96)
    return shared <= 64 ? launch_fwd_hybrid<T, 512, 32, 64>(a) : launch_fwd_hybrid<T, 512, 32, 96>(a);
  if (threads == 256 && items == 64 && shared <= 192)
    return shared <= 128 ? launch_fwd_hybrid<T, 256, 64, 128>(a) : launch_fwd_hybrid<T, 256, 64, 192>(a);
  return cudaErrorNotSupported;
}

cudaError_t tuned_bwd_persist(const void* y, const void* dy, void* dx, int64_t rows, int64_t cols, int items,
                              int threads, int buffers, int ctas, cudaStream_t stream) {
  const Args a{y, dy, dx, rows, cols, cols, 1, 0, 1.f, false, stream, nullptr};
  if (rows <= 0 || !is_aligned<T>(a, true)) return cudaErrorNotSupported;
  return with_persist_shape(cols, threads, items, buffers, ctas, [&](auto c, auto l, auto it, auto b) {
    if constexpr (V(it) > 32)
      return cudaErrorNotSupported;
    else
      return launch_bwd_persist<T, V(l), V(it), V(b), V(c)>(a);
  });
}

#undef V

}  // namespace softmax_harness
