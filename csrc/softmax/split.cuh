// The split path's exchange through global memory (device code; the code paths: paths.cuh): the
// register kernels with SPAN = kSplit combine the partials of a row's slices in the workspace.
#pragma once

#include "common.cuh"

namespace softmax_harness {
namespace detail {

// Split path: thread 0 publishes the block's partial, arrives (release) and waits for the row's other
// slices (acquire); after a barrier warp 0 merges the row's partials (read from L2) and broadcasts.
// Every block of the row merges them in the same order: bit-identical statistics.
__device__ __forceinline__ void split_arrive_and_wait(const SplitWs& ws, int64_t row) {
  unsigned* c = ws.cnt + 1 + row;
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(c) : "memory");
  unsigned v;
  do {
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(c) : "memory");
  } while (v < (unsigned)ws.splits);
}

__device__ __forceinline__ void split_stats(float& m, float& s, const SplitWs& ws, int64_t row, int part,
                                            float2* bcast, float a) {
  float2* mine = ws.stats + row * ws.splits;
  if (threadIdx.x == 0) {
    mine[part] = make_float2(m, s);
    split_arrive_and_wait(ws, row);
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    float cm = -INFINITY, cs = 0.f;
    for (int k = threadIdx.x; k < ws.splits; k += 32) {
      const float2 o = __ldcg(mine + k);
      merge_stats(cm, cs, o.x, o.y, a);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float mo = __shfl_xor_sync(0xffffffffu, cm, o);
      const float so = __shfl_xor_sync(0xffffffffu, cs, o);
      merge_stats(cm, cs, mo, so, a);
    }
    if (threadIdx.x == 0) *bcast = make_float2(cm, cs);
  }
  __syncthreads();
  m = bcast->x;
  s = bcast->y;
}

__device__ __forceinline__ float split_sum(float v, const SplitWs& ws, int64_t row, int part, float* bcast) {
  float* mine = reinterpret_cast<float*>(ws.stats) + row * ws.splits;
  if (threadIdx.x == 0) {
    mine[part] = v;
    split_arrive_and_wait(ws, row);
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    float t = 0.f;
    for (int k = threadIdx.x; k < ws.splits; k += 32) t += __ldcg(mine + k);
    t = warp_sum<32>(t);
    if (threadIdx.x == 0) *bcast = t;
  }
  __syncthreads();
  return *bcast;
}

}  // namespace detail
}  // namespace softmax_harness
