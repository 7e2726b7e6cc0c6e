// The launch variants behind the table in softmax_kernels.cu (see softmax_tuning.h).
#include "softmax_tuning.h"

#include "softmax_device.cuh"

namespace softmax_harness {
namespace {

using namespace detail;
using T = __nv_bfloat16;

template <int BN, int ITEMS>
cudaError_t reg_fwd(const Args& a, bool merged, bool packed) {
  if constexpr (BN / ITEMS > 1024 || ITEMS > BN) {
    return cudaErrorNotSupported;
  } else {
    if (packed)
      return merged ? launch_fwd_register<T, BN, ITEMS, true, true>(a) : launch_fwd_register<T, BN, ITEMS, false, true>(a);
    return merged ? launch_fwd_register<T, BN, ITEMS, true, false>(a) : launch_fwd_register<T, BN, ITEMS, false, false>(a);
  }
}

template <int BN, int ITEMS>
cudaError_t reg_bwd(const Args& a, bool cap) {
  if constexpr (BN / ITEMS > 1024 || ITEMS > BN) {
    return cudaErrorNotSupported;
  } else {
    return cap ? launch_bwd_register<T, BN, ITEMS, true>(a) : launch_bwd_register<T, BN, ITEMS, false>(a);
  }
}

template <int BN>
cudaError_t reg_fwd_items(const Args& a, int items, bool merged, bool packed) {
  switch (items) {
    case 8: return reg_fwd<BN, 8>(a, merged, packed);
    case 16: return reg_fwd<BN, 16>(a, merged, packed);
    case 32: return reg_fwd<BN, 32>(a, merged, packed);
    case 64: return reg_fwd<BN, 64>(a, merged, packed);
  }
  return cudaErrorNotSupported;
}

template <int BN>
cudaError_t reg_bwd_items(const Args& a, int items, bool cap) {
  switch (items) {
    case 8: return reg_bwd<BN, 8>(a, cap);
    case 16: return reg_bwd<BN, 16>(a, cap);
    case 32: return reg_bwd<BN, 32>(a, cap);
    case 64: return reg_bwd<BN, 64>(a, cap);
  }
  return cudaErrorNotSupported;
}

#define BN_CASES(X) X(128) X(256) X(512) X(1024) X(2048) X(4096) X(8192) X(16384) X(32768)

template <int L, int ITEMS>
cudaError_t cluster_fwd(const Args& a, bool merged, bool packed) {
  if (packed)
    return merged ? launch_fwd_cluster<T, L, ITEMS, true, true>(a) : launch_fwd_cluster<T, L, ITEMS, false, true>(a);
  return merged ? launch_fwd_cluster<T, L, ITEMS, true, false>(a) : launch_fwd_cluster<T, L, ITEMS, false, false>(a);
}

template <int L>
cudaError_t cluster_fwd_items(const Args& a, int items, bool merged, bool packed) {
  switch (items) {
    case 16: return cluster_fwd<L, 16>(a, merged, packed);
    case 32: return cluster_fwd<L, 32>(a, merged, packed);
  }
  return cudaErrorNotSupported;
}

template <int L>
cudaError_t cluster_bwd_items(const Args& a, int items, bool cap) {
  switch (items) {
    case 16: return cap ? launch_bwd_cluster<T, L, 16, true>(a) : launch_bwd_cluster<T, L, 16, false>(a);
    case 32: return cap ? launch_bwd_cluster<T, L, 32, true>(a) : launch_bwd_cluster<T, L, 32, false>(a);
  }
  return cudaErrorNotSupported;
}

bool cluster_fits(int64_t cols, int threads, int items) {
  const int n = ctas_for(cols, threads, items);
  return n >= 1 && n <= 16;
}

}  // namespace

cudaError_t tuned_fwd(const void* x, void* y, int64_t rows, int64_t cols, int items, bool merged,
                      bool packed, int cluster_threads, cudaStream_t stream) {
  const Args a{x, nullptr, y, rows, cols, cols, 1, 0, 1.f, false, stream};
  if (rows <= 0 || !is_aligned<T>(a, false)) return cudaErrorNotSupported;
  if (cluster_threads > 0) {
    if (!cluster_fits(cols, cluster_threads, items)) return cudaErrorNotSupported;
    switch (cluster_threads) {
      case 128: return cluster_fwd_items<128>(a, items, merged, packed);
      case 256: return cluster_fwd_items<256>(a, items, merged, packed);
      case 512: return cluster_fwd_items<512>(a, items, merged, packed);
    }
    return cudaErrorNotSupported;
  }
  switch (next_pow2_at_least(cols, 128)) {
#define CASE(BN) \
  case BN:       \
    return reg_fwd_items<BN>(a, items, merged, packed);
    BN_CASES(CASE)
#undef CASE
  }
  return cudaErrorNotSupported;
}

cudaError_t tuned_bwd(const void* y, const void* dy, void* dx, int64_t rows, int64_t cols, int items,
                      bool cap, int cluster_threads, cudaStream_t stream) {
  const Args a{y, dy, dx, rows, cols, cols, 1, 0, 1.f, false, stream};
  if (rows <= 0 || !is_aligned<T>(a, true)) return cudaErrorNotSupported;
  if (cluster_threads > 0) {
    if (!cluster_fits(cols, cluster_threads, items)) return cudaErrorNotSupported;
    switch (cluster_threads) {
      case 128: return cluster_bwd_items<128>(a, items, cap);
      case 256: return cluster_bwd_items<256>(a, items, cap);
      case 512: return cluster_bwd_items<512>(a, items, cap);
    }
    return cudaErrorNotSupported;
  }
  switch (next_pow2_at_least(cols, 128)) {
#define CASE(BN) \
  case BN:       \
    return reg_bwd_items<BN>(a, items, cap);
    BN_CASES(CASE)
#undef CASE
  }
  return cudaErrorNotSupported;
}

}  // namespace softmax_harness
