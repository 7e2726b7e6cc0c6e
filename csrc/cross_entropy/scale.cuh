// The backward's scale (device code; the code paths: paths.cuh): grad (rows, cols) *= s, s a device
// scalar (s_stride 0) or one per row (s_stride 1). The gradient was computed in the forward, so the
// backward only multiplies by grad_output, which is exactly 1 when the loss is the last op: then every
// block reads s once and returns (the backward costs a launch, not a pass). A grid-stride loop over
// tiles of TILE columns of a row; a per-row s is read per tile and a tile whose s is 1 is skipped.
#pragma once

#include "common.cuh"

namespace softmax_harness {
namespace ce {

template <int THREADS, int VEC>
struct ScaleTile {
  static constexpr int UNROLL = 4;
  static constexpr int64_t TILE = (int64_t)THREADS * VEC * UNROLL;  // columns per tile
};

// VEC > 1: row starts 16-byte aligned (the host checks); the last vector of a row may be partial.
template <typename T, int VEC, int THREADS>
__global__ void __launch_bounds__(THREADS)
    scale_grad_kernel(T* g, int64_t rows, int64_t cols, int64_t stride, const float* s, int64_t s_stride,
                      int64_t tiles_per_row) {
  using Tile = ScaleTile<THREADS, VEC>;
  float sv = 1.f;
  if (s_stride == 0) {
    sv = __ldg(s);
    if (sv == 1.f) return;
  }
  const int64_t tiles = rows * tiles_per_row;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t row = tile / tiles_per_row;
    if (s_stride != 0) {
      sv = __ldg(s + row * s_stride);
      if (sv == 1.f) continue;  // (uniform over the block)
    }
    const int64_t c_begin = (tile - row * tiles_per_row) * Tile::TILE;
    const int64_t c_end = c_begin + Tile::TILE < cols ? c_begin + Tile::TILE : cols;
    T* r = g + row * stride;
    Pack<T, VEC> v[Tile::UNROLL];
#pragma unroll
    for (int u = 0; u < Tile::UNROLL; ++u) {  // loads first
      const int64_t c0 = c_begin + ((int64_t)u * THREADS + threadIdx.x) * VEC;
      if (c0 + VEC <= c_end) {
        v[u] = *reinterpret_cast<const Pack<T, VEC>*>(r + c0);
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) v[u].v[j] = c0 + j < c_end ? r[c0 + j] : Cvt<T>::store(0.f);
      }
    }
#pragma unroll
    for (int u = 0; u < Tile::UNROLL; ++u) {
      const int64_t c0 = c_begin + ((int64_t)u * THREADS + threadIdx.x) * VEC;
      Pack<T, VEC> o;
#pragma unroll
      for (int j = 0; j < VEC; ++j) o.v[j] = Cvt<T>::store(Cvt<T>::load(v[u].v[j]) * sv);
      if (c0 + VEC <= c_end) {
        *reinterpret_cast<Pack<T, VEC>*>(r + c0) = o;
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j)
          if (c0 + j < c_end) r[c0 + j] = o.v[j];
      }
    }
  }
}

}  // namespace ce
}  // namespace softmax_harness
