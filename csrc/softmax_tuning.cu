// The launch variants behind the table in softmax_kernels.cu (see softmax_tuning.h).
#include "softmax_tuning.h"

#include "softmax/launch.cuh"

namespace softmax_harness {
namespace {

using namespace detail;
using T = __nv_bfloat16;

using tuning::with_bool;
using tuning::with_int;

#define V(x) std::decay_t<decltype(x)>::value

bool cluster_fits(int64_t cols, int threads, int items) {
  const int n = ctas_for(cols, threads, items);
  return n >= 1 && n <= 16;
}

// Register-path variants: rows of up to 32768 columns, 8-64 elements per thread, <= 1024 threads.
template <typename F>
cudaError_t with_register_shape(int64_t cols, int items, F&& f) {
  return with_int<128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768>(next_pow2_at_least(cols, 128), [&](auto bn) {
    return with_int<8, 16, 32, 64>(items, [&](auto it) {
      if constexpr (V(bn) / V(it) > 1024 || V(it) > V(bn))
        return cudaErrorNotSupported;
      else
        return f(bn, it);
    });
  });
}

// Cluster and split variants: CTAs of 128-512 threads x 8-64 elements, 1-16 (cluster) or 1-128 (split)
// of them per row.
template <typename F>
cudaError_t with_slice_shape(int64_t rows, int64_t cols, bool split, int threads, int items, F&& f) {
  if (split ? !split_fits(rows, cols, threads, items) : !cluster_fits(cols, threads, items))
    return cudaErrorNotSupported;
  return with_int<128, 256, 512>(threads, [&](auto l) { return with_int<8, 16, 32, 64>(items, [&](auto it) { return f(l, it); }); });
}

}  // namespace

int64_t tuned_workspace_bytes(int64_t rows) { return split_counter_bytes(rows) + rows * kMaxSplits * 8; }

cudaError_t tuned_fwd(const void* x, void* y, int64_t rows, int64_t cols, int items, bool merged,
                      bool packed, int path, int threads, int buffers, int ctas, void* workspace,
                      cudaStream_t stream) {
  const Args a{x, nullptr, y, rows, cols, cols, 1, 0, 1.f, false, stream, workspace};
  if (rows <= 0 || !is_aligned<T>(a, false) || path < 0 || path > 4) return cudaErrorNotSupported;
  if (path == 3) return tuned_fwd_persist(x, y, rows, cols, items, merged, packed, threads, buffers, ctas, stream);
  if (path == 4) return merged && packed ? tuned_fwd_hybrid(x, y, rows, cols, items, threads, stream) : cudaErrorNotSupported;
  if ((path == 1 || path == 2) && !merged) return cudaErrorNotSupported;
  return with_bool(merged, [&](auto m) {
    return with_bool(packed, [&](auto p) {
      if (path == 0)
        return with_register_shape(cols, items, [&](auto bn, auto it) {
          return launch_fwd_register<T, V(bn), V(it), V(m), V(p)>(a);
        });
      return with_slice_shape(rows, cols, path == 2, threads, items, [&](auto l, auto it) {
        if constexpr (V(m))
          return path == 2 ? launch_fwd_split<T, V(l), V(it), V(p)>(a) : launch_fwd_cluster<T, V(l), V(it), V(p)>(a);
        else
          return cudaErrorNotSupported;  // split and cluster paths: one merged exchange
      });
    });
  });
}

cudaError_t tuned_bwd(const void* y, const void* dy, void* dx, int64_t rows, int64_t cols, int items,
                      bool cap, int path, int threads, int buffers, int ctas, void* workspace,
                      cudaStream_t stream) {
  const Args a{y, dy, dx, rows, cols, cols, 1, 0, 1.f, false, stream, workspace};
  if (rows <= 0 || !is_aligned<T>(a, true) || path < 0 || path > 3) return cudaErrorNotSupported;
  if (path == 3)
    return cap ? cudaErrorNotSupported : tuned_bwd_persist(y, dy, dx, rows, cols, items, threads, buffers, ctas, stream);
  return with_bool(cap, [&](auto c) {
    if (path == 0)
      return with_register_shape(cols, items, [&](auto bn, auto it) {
        return launch_bwd_register<T, V(bn), V(it), V(c)>(a);
      });
    return with_slice_shape(rows, cols, path == 2, threads, items, [&](auto l, auto it) {
      return path == 2 ? launch_bwd_split<T, V(l), V(it), V(c)>(a) : launch_bwd_cluster<T, V(l), V(it), V(c)>(a);
    });
  });
}

#undef V

}  // namespace softmax_harness
