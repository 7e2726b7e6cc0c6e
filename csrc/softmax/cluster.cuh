// Exchanges between the CTAs of a thread-block cluster through distributed shared memory and
// mbarriers (device code; the code paths: paths.cuh): ClusterXchg / xchg for the persistent path
// over a cluster (one exchange per row), ClusterSlots / cluster_xchg for the cluster path (the
// register kernels with SPAN = kCluster: one exchange per kernel).
#pragma once

#include "common.cuh"

namespace softmax_harness {
namespace detail {

// Persistent clusters exchange one partial per row without a cluster-wide barrier: each CTA keeps,
// per row parity, an mbarrier expecting C - 1 arrivals and C slots. Thread t < C (t != own rank)
// stores this CTA's partial into CTA t's slot [own rank] (distributed shared memory) and arrives
// (release, cluster scope) on CTA t's mbarrier; every thread waits on its own mbarrier (acquire) and
// merges the C partials in rank order, its own from registers: the same result in every CTA. A slot
// of parity p is written again only for row k + 2, which no peer reaches before this CTA has sent
// its row k + 1 partial, i.e. after all its threads passed row k + 1's block barrier (done reading).
template <typename V, int C>
struct ClusterXchg {
  uint64_t bar[2];
  V val[2][C];
};

__device__ __forceinline__ unsigned smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ unsigned map_to_rank(unsigned addr, unsigned rank) {
  unsigned out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(addr), "r"(rank));
  return out;
}
__device__ __forceinline__ void st_cluster(unsigned addr, float2 v) {
  asm volatile("st.shared::cluster.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(v.x), "f"(v.y) : "memory");
}
__device__ __forceinline__ void st_cluster(unsigned addr, float v) {
  asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(unsigned bar, unsigned parity) {
  unsigned done;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
      " selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}

// Before the first exchange: the mbarriers initialized and visible to the whole cluster.
template <typename V, int C>
__device__ __forceinline__ void xchg_init(ClusterXchg<V, C>& x) {
  if (threadIdx.x == 0) {
#pragma unroll
    for (int p = 0; p < 2; ++p)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(&x.bar[p])), "r"(C - 1) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  cg::this_cluster().sync();
}

// Row k's partials of all C CTAs (this one's is `mine`, the same in all its threads), each passed to
// merge(v) in rank order.
template <typename V, int C, typename Merge>
__device__ __forceinline__ void xchg(ClusterXchg<V, C>& x, unsigned rank, int k, V mine, Merge&& merge) {
  const int p = k & 1;
  if (threadIdx.x < C && threadIdx.x != rank) {
    st_cluster(map_to_rank(smem_u32(&x.val[p][rank]), threadIdx.x), mine);
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(
                     map_to_rank(smem_u32(&x.bar[p]), threadIdx.x))
                 : "memory");
  }
  while (!mbar_try_wait(smem_u32(&x.bar[p]), (unsigned)(k >> 1) & 1u)) {
  }
#pragma unroll
  for (int r = 0; r < C; ++r) merge(r == (int)rank ? mine : x.val[p][r]);
}

// Register-path clusters (one row per cluster, n <= 16 CTAs: the launchers never ask for more; n known
// at run time): one exchange per
// kernel, through the same scheme. cluster_begin() right after the loads are issued: the mbarrier
// initialized and a cluster barrier arrived at; cluster_xchg() waits on that barrier (every peer's
// mbarrier initialized: the wait overlaps the loads), exchanges, and arrives at a closing barrier
// that cluster_end() waits on just before exit (no CTA leaves while a peer's store into it may be in
// flight; the wait overlaps the output stores).
template <typename V>
struct ClusterSlots {
  uint64_t bar;
  V val[16];
};

template <typename V>
__device__ __forceinline__ void cluster_begin(ClusterSlots<V>& x, unsigned n) {
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(&x.bar)), "r"(n - 1) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}

template <typename V, typename Merge>
__device__ __forceinline__ void cluster_xchg(ClusterSlots<V>& x, unsigned n, unsigned rank, V mine, Merge&& merge) {
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
  if (threadIdx.x < n && threadIdx.x != rank) {
    st_cluster(map_to_rank(smem_u32(&x.val[rank]), threadIdx.x), mine);
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(
                     map_to_rank(smem_u32(&x.bar), threadIdx.x))
                 : "memory");
  }
  while (!mbar_try_wait(smem_u32(&x.bar), 0u)) {
  }
  for (unsigned r = 0; r < n; ++r) merge(r == rank ? mine : x.val[r]);
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void cluster_end() { asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory"); }

}  // namespace detail
}  // namespace softmax_harness
