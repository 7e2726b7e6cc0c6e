// What the code paths share (device code; the code paths are listed in paths.cuh): element types and
// conversions, 16-byte vector loads, the row reductions, row indexing, the fill of masked columns and
// the row math on 16-byte vectors (register, persistent and hybrid paths), cp.async.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

namespace softmax_harness {
namespace detail {

namespace cg = cooperative_groups;

constexpr float kLog2e = 1.4426950408889634f;

// How a row maps onto blocks: inside one block (several rows per block when short), over a cluster,
// or split over ordinary blocks that meet in global memory.
enum Span : int { kBlock = 0, kCluster = 1, kSplit = 2 };

// Workspace of the split path (zeroed counters before each launch): cnt[0] is the ticket counter,
// cnt[1 + row] the row's arrival counter; stats holds the row's `splits` partials.
struct SplitWs {
  unsigned* cnt;
  float2* stats;
  int splits;
};

template <typename T>
struct Cvt;
template <>
struct Cvt<float> {
  static __device__ __forceinline__ float load(float v) { return v; }
  static __device__ __forceinline__ float store(float v) { return v; }
};
template <>
struct Cvt<__half> {
  static __device__ __forceinline__ float load(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half store(float v) { return __float2half_rn(v); }
};
template <>
struct Cvt<__nv_bfloat16> {
  static __device__ __forceinline__ float load(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 store(float v) { return __float2bfloat16_rn(v); }
};

template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
  T v[VEC];
};

// A 16-byte vector kept as four 32-bit words (two 16-bit elements per word), so 16-bit rows held in
// registers take half the registers of fp32 copies (a 16-bit value alone would occupy a whole register).
// get: element j as fp32. get_again: the same, opaque to the compiler (volatile asm), so a second use
// re-converts from the word instead of keeping the fp32 copy alive.
__device__ __forceinline__ unsigned word_of(const uint4& w, int i) {
  return i == 0 ? w.x : i == 1 ? w.y : i == 2 ? w.z : w.w;
}
template <typename T>
struct Words;
template <>
struct Words<float> {
  static __device__ __forceinline__ float get(const uint4& w, int j) { return __uint_as_float(word_of(w, j)); }
  static __device__ __forceinline__ float get_again(const uint4& w, int j) { return get(w, j); }
};
template <>
struct Words<__nv_bfloat16> {
  static __device__ __forceinline__ float get(const uint4& w, int j) {
    const unsigned u = word_of(w, j >> 1);
    return __uint_as_float((j & 1) ? (u & 0xffff0000u) : (u << 16));
  }
  static __device__ __forceinline__ float get_again(const uint4& w, int j) {
    const unsigned u = word_of(w, j >> 1);
    unsigned r;
    if (j & 1)
      asm volatile("and.b32 %0, %1, 0xffff0000;" : "=r"(r) : "r"(u));
    else
      asm volatile("shl.b32 %0, %1, 16;" : "=r"(r) : "r"(u));
    return __uint_as_float(r);
  }
};
template <>
struct Words<__half> {
  static __device__ __forceinline__ float get(const uint4& w, int j) {
    const unsigned u = word_of(w, j >> 1);
    return __half2float(__ushort_as_half((unsigned short)((j & 1) ? (u >> 16) : (u & 0xffffu))));
  }
  static __device__ __forceinline__ float get_again(const uint4& w, int j) {
    const unsigned u = word_of(w, j >> 1);
    float f;
    if (j & 1)
      asm volatile("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.f32.f16 %0, hi;\n}" : "=f"(f) : "r"(u));
    else
      asm volatile("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.f32.f16 %0, lo;\n}" : "=f"(f) : "r"(u));
    return f;
  }
};

// VEC elements from column c0: one 16-byte load when all are unmasked, else element by element.
template <typename T, int VEC>
__device__ __forceinline__ Pack<T, VEC> load_prefix(const T* p, int c0, int lim) {
  Pack<T, VEC> out;
  if (c0 + VEC <= lim) {
    out = *reinterpret_cast<const Pack<T, VEC>*>(p + c0);
  } else {
#pragma unroll
    for (int j = 0; j < VEC; ++j) out.v[j] = c0 + j < lim ? p[c0 + j] : Cvt<T>::store(0.f);
  }
  return out;
}

// The 16-byte vector at column c0 if it holds an unmasked column (c0 < lim), else zeros. No branch:
// a predicated load, so a thread's loads of a row are all issued before the first is used. A vector
// that straddles lim is read whole (it lies inside the row: cols is a multiple of VEC wherever this
// is used); the caller masks its columns >= lim.
template <typename T, int VEC>
__device__ __forceinline__ uint4 load_vec(const T* p, int c0, int lim) {
  uint4 w = make_uint4(0u, 0u, 0u, 0u);
  if (c0 < lim) w = *reinterpret_cast<const uint4*>(p + c0);
  return w;
}

// 2^x with the SFU instruction (relative error ~2^-22, what Triton's tl.exp2 uses as well).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// ---------------------------------------------------------------------------------------------
// reductions
// ---------------------------------------------------------------------------------------------
// Maxima are taken on the keys x * sign(c) (exact), not on x * c: an element's exponent is then
// (x - ref * sign(c)) * c = (key - ref) * |c|, exactly 0 at the row's max whatever its magnitude.
// (exp2(fma(x, c, -round(max * c))) shifts every exponent by the max's rounding error, up to
// |max * c| / 2^25, which overflows or underflows exp2 beyond |max * c| ~ 2^32.)
__device__ __forceinline__ float sign_of(float c) { return copysignf(1.f, c); }  // (c > 0 ? 1 : -1 for c != 0)

// A sum s of exponentials relative to key max m, brought to the reference ref (a = |c| > 0: an empty
// part, m = -inf, adds 0; the stream path, whose scale may be 0, starts its maxima at -FLT_MAX).
__device__ __forceinline__ float rescaled(float s, float m, float ref, float a) {
  return s * fast_exp2((m - ref) * a);
}

// Merge two (max, sum) partials of an online softmax (maxima of keys, sums relative to them, exp2
// domain, a = |c|). -inf maxima (nothing unmasked yet) merge without NaN; a NaN sum stays NaN.
__device__ __forceinline__ void merge_stats(float& m, float& s, float mo, float so, float a) {
  const float mn = fmaxf(m, mo);
  const float ref = mn == -INFINITY ? 0.f : mn;
  s = rescaled(s, m, ref, a) + rescaled(so, mo, ref, a);
  m = mn;
}

// Butterfly max / sum over aligned groups of W lanes (W a power of two, at most 32): every lane of a
// group gets its group's result.
template <int W>
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = W / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o, W));
  return v;
}
template <int W>
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = W / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o, W);
  return v;
}

// Reductions over the L threads of one row; every thread gets the result. L <= 32: inside a warp
// (rows never straddle warps). L > 32: the block is one row; each warp leaves its partial in `red`,
// one barrier, then every warp combines all partials itself. One barrier per reduction: each `red`
// buffer serves one reduction per kernel, so nothing is overwritten while another warp reads it.
template <int L>
__device__ __forceinline__ void row_stats(float& m, float& s, float2* red, float a) {
  constexpr int W = L < 32 ? L : 32;
#pragma unroll
  for (int o = W / 2; o > 0; o >>= 1) {
    const float mo = __shfl_xor_sync(0xffffffffu, m, o, W);
    const float so = __shfl_xor_sync(0xffffffffu, s, o, W);
    merge_stats(m, s, mo, so, a);
  }
  if constexpr (L > 32) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) red[warp] = make_float2(m, s);
    __syncthreads();
    const float2 v = lane < L / 32 ? red[lane] : make_float2(-FLT_MAX, 0.f);  // (the stream path's start)
    m = v.x;
    s = v.y;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float mo = __shfl_xor_sync(0xffffffffu, m, o);
      const float so = __shfl_xor_sync(0xffffffffu, s, o);
      merge_stats(m, s, mo, so, a);
    }
  }
}

// One-pass (merged) statistics of a row from each thread's max m of x * c: the max over the warp (over
// the row's W lanes when L <= 32), this thread's exponentials against it (exp_sum(ref) returns their
// sum), the warp's sum; L > 32: the warps' (max, sum) pairs meet in `red` after one barrier, and
// every warp takes the row max of them and the sum of their sums rescaled to it. Returns ref (the
// warp max, 0 if -inf); M, S: the row max and the row's sum of exp2(x * c - M). A max and a sum per
// shuffle step, not a (max, sum) merge (two exponentials) at every step as in row_stats.
template <int L, typename ExpSum>
__device__ __forceinline__ float merged_stats(float m, ExpSum&& exp_sum, float2* red, float& M, float& S, float a) {
  constexpr int W = L < 32 ? L : 32;
  m = warp_max<W>(m);
  const float ref = m == -INFINITY ? 0.f : m;
  const float s = warp_sum<W>(exp_sum(ref));
  M = m;
  S = s;
  if constexpr (L > 32) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) red[warp] = make_float2(m, s);
    __syncthreads();
    const float2 p = lane < L / 32 ? red[lane] : make_float2(-INFINITY, 0.f);
    M = warp_max<32>(p.x);
    S = warp_sum<32>(rescaled(p.y, p.x, M == -INFINITY ? 0.f : M, a));  // a warp with nothing unmasked adds 0
  }
  return ref;
}

template <int L>
__device__ __forceinline__ float row_sum(float v, float* red) {
  v = warp_sum<(L < 32 ? L : 32)>(v);
  if constexpr (L > 32) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = warp_sum<32>(lane < L / 32 ? red[lane] : 0.f);
  }
  return v;
}

template <int L>
__device__ __forceinline__ float row_max(float v, float* red) {
  v = warp_max<(L < 32 ? L : 32)>(v);
  if constexpr (L > 32) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = warp_max<32>(lane < L / 32 ? red[lane] : -INFINITY);
  }
  return v;
}

// ---------------------------------------------------------------------------------------------
// indexing helpers
// ---------------------------------------------------------------------------------------------
// Number of unmasked keys of a row: all of them, or query i = row mod tq keeps j <= i + diag.
// rows, tq < 2^31 (checked on the host): 32-bit modulo, no 64-bit division routine.
__device__ __forceinline__ int row_limit(int64_t row, int cols, int64_t tq, int64_t diag, bool causal) {
  if (!causal) return cols;
  const int64_t l = (int64_t)((unsigned)row % (unsigned)tq) + diag + 1;
  return (int)(l < 0 ? 0 : (l < cols ? l : cols));
}

template <typename T, int VEC>
__device__ __forceinline__ void store_row(T* p, int c0, int cols, const Pack<T, VEC>& v) {
  if (c0 + VEC <= cols) {
    *reinterpret_cast<Pack<T, VEC>*>(p + c0) = v;
  } else {
#pragma unroll
    for (int j = 0; j < VEC; ++j)
      if (c0 + j < cols) p[c0 + j] = v.v[j];
  }
}

// ---------------------------------------------------------------------------------------------
// fill of masked columns and row math on 16-byte vectors (register, persistent and hybrid paths)
// ---------------------------------------------------------------------------------------------
// Masked columns are read as the value whose scaled score x * c is -inf (-inf for c > 0, +inf for
// c < 0), so the math after the loads needs no per-element mask: the max ignores them, their
// exponentials are exactly 0 (so are their outputs), and they add 0 to the sum. The host sends only
// normal, finite c to these kernels (else the stream path, which masks element by element).
template <typename T>
__device__ __forceinline__ unsigned fill_word(float c) {  // one 32-bit word of fill values
  if constexpr (sizeof(T) == 4)
    return c > 0.f ? 0xff800000u : 0x7f800000u;
  else if constexpr (std::is_same_v<T, __half>)
    return c > 0.f ? 0xfc00fc00u : 0x7c007c00u;
  else
    return c > 0.f ? 0xff80ff80u : 0x7f807f80u;
}

// The vector with its elements k, k + 1, ... replaced by the fill (0 < k < VEC).
template <typename T>
__device__ __forceinline__ uint4 fill_from(uint4 w, int k, unsigned fill) {
  constexpr int PER = 4 / (int)sizeof(T);  // elements per word
  auto word = [&](unsigned u, int q) {
    const int j = q * PER;  // the word's first element
    const unsigned keep = j >= k ? 0u : (PER == 2 && j + 1 >= k ? 0x0000ffffu : 0xffffffffu);
    return (u & keep) | (fill & ~keep);
  };
  return make_uint4(word(w.x, 0), word(w.y, 1), word(w.z, 2), word(w.w, 3));
}

// The fill in this thread's vectors (vector i at column first + i * L * VEC) at and past column lim:
// only vectors that reach past lim are touched (one per row, plus the masked ones of causal rows).
template <typename T, int VEC, int NV, int L>
__device__ __forceinline__ void mask_tail(uint4* w, int first, int lim, unsigned fill) {
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int c0 = first + i * L * VEC;
    if (c0 >= lim)
      w[i] = make_uint4(fill, fill, fill, fill);
    else if (c0 + VEC > lim)
      w[i] = fill_from<T>(w[i], lim - c0, fill);
  }
}

// Max of the keys x * sign(c) over this thread's elements (see sign_of): max(x) for c > 0, -min(x)
// for c < 0; 16-bit pairs are compared packed (two per instruction). Like fmaxf, the comparisons skip
// NaN (a NaN still makes its row NaN through the sum).
template <typename T>
struct Pair;
template <>
struct Pair<__nv_bfloat16> {
  using type = __nv_bfloat162;
};
template <>
struct Pair<__half> {
  using type = __half2;
};
template <typename T, int NV>
__device__ __forceinline__ float max_key(const uint4* w, float c) {
  const bool pos = c > 0.f;
  if constexpr (sizeof(T) == 4) {
    float m = __uint_as_float(w[0].x);
#pragma unroll
    for (int i = 0; i < NV; ++i)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float v = __uint_as_float(word_of(w[i], q));
        m = pos ? fmaxf(m, v) : fminf(m, v);
      }
    return pos ? m : -m;
  } else {
    using P = typename Pair<T>::type;
    auto pair = [](unsigned u) {
      P p;
      memcpy(&p, &u, 4);
      return p;
    };
    P m = pair(w[0].x);
#pragma unroll
    for (int i = 0; i < NV; ++i)
#pragma unroll
      for (int q = 0; q < 4; ++q) m = pos ? __hmax2(m, pair(word_of(w[i], q))) : __hmin2(m, pair(word_of(w[i], q)));
    unsigned u;
    memcpy(&u, &m, 4);
    const uint4 r = make_uint4(u, 0u, 0u, 0u);
    const float lo = Words<T>::get(r, 0), hi = Words<T>::get(r, 1);
    return pos ? fmaxf(lo, hi) : -fminf(lo, hi);
  }
}

// v[k] <- exp2((x_k - r) * c) (r = the reference key ref * sign(c), see sign_of), x_k read from the
// row's words (masked columns hold the fill, whose exponential is 0); returns their sum. Vector i of
// this thread starts at column first + i * L * VEC.
template <typename T, int VEC, int NV>
__device__ __forceinline__ float exp_words(float* v, const uint4* w, float c, float r) {
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < NV; ++i)
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float e = fast_exp2((Words<T>::get(w[i], j) - r) * c);
      v[i * VEC + j] = e;
      s += e;
    }
  return s;
}

// Row outputs of this thread's vectors (vector i at column first + i * L * VEC; cols a multiple of VEC):
// element j of vector i is out(i, j), rounded to T, one 16-byte store per vector. FULL: the caller
// knows every vector lies inside the row (no per-vector check).
template <typename T, int VEC, int NV, int L, bool FULL = false, typename Out>
__device__ __forceinline__ void store_vectors(T* r, int first, int cols, Out&& out) {
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int c0 = first + i * L * VEC;
    if (!FULL && c0 >= cols) continue;
    Pack<T, VEC> o;
#pragma unroll
    for (int j = 0; j < VEC; ++j) o.v[j] = Cvt<T>::store(out(i, j));
    *reinterpret_cast<Pack<T, VEC>*>(r + c0) = o;
  }
}

// Forward: y = v * f (v: the exponentials, 0 where masked).
template <typename T, int VEC, int NV, int L, bool FULL = false>
__device__ __forceinline__ void store_scaled(T* yr, const float* v, int first, int cols, float f) {
  store_vectors<T, VEC, NV, L, FULL>(yr, first, cols, [&](int i, int j) { return v[i * VEC + j] * f; });
}

// Backward, this thread's part of dot = sum(y * dy) over the columns before lim, from the packed y and
// dy words. Masks compare an element's index in its vector with lim - (the vector's first column): one
// value a vector, where comparing each column's index with lim had ptxas keep a register (or a spill
// slot) for every column's index (nvcc 13.0, 1024 threads x 32 bf16: 28 bytes spilled at 64 registers,
// the later vectors' loads issued only after the first products; this form: 54 registers, no spill,
// every load issued first).
template <typename T, int VEC, int NV, int L>
__device__ __forceinline__ float masked_dot(const uint4* ya, const uint4* ga, int first, int lim) {
  float dot = 0.f;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int left = lim - (first + i * L * VEC);  // unmasked columns from this vector's first on
#pragma unroll
    for (int j = 0; j < VEC; ++j)
      if (j < left) dot += Words<T>::get(ya[i], j) * Words<T>::get(ga[i], j);
  }
  return dot;
}

// Backward: dx = scale * y * (dy - dot) from the packed y and dy words, 0 past lim (masked as above).
template <typename T, int VEC, int NV, int L>
__device__ __forceinline__ void store_dx(T* xr, const uint4* ya, const uint4* ga, int first, int cols, int lim,
                                         float scale, float dot) {
  store_vectors<T, VEC, NV, L>(xr, first, cols, [&](int i, int j) {
    const float yy = Words<T>::get_again(ya[i], j);
    return j < lim - (first + i * L * VEC) ? scale * yy * (Words<T>::get_again(ga[i], j) - dot) : 0.f;
  });
}

// Packed rows (the words as loaded, masked columns holding the fill): the sum of exp2((x - r) * c),
// and the outputs exp2((x - r) * c) * f (cols a multiple of VEC).
template <typename T, int VEC, int NV>
__device__ __forceinline__ float packed_exp_sum(const uint4* w, float c, float r) {
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < NV; ++i)
#pragma unroll
    for (int j = 0; j < VEC; ++j) s += fast_exp2((Words<T>::get_again(w[i], j) - r) * c);
  return s;
}

template <typename T, int VEC, int NV, int L, bool FULL = false>
__device__ __forceinline__ void store_exp(T* yr, const uint4* w, int first, int cols, float c, float r, float f) {
  store_vectors<T, VEC, NV, L, FULL>(
      yr, first, cols, [&](int i, int j) { return fast_exp2((Words<T>::get_again(w[i], j) - r) * c) * f; });
}

// ---------------------------------------------------------------------------------------------
// cp.async (persistent and hybrid paths: global memory to shared memory, 16 bytes per copy)
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ void cp_async16(uint4* dst, const void* src, bool read) {
  const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(read ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async16(uint4* dst, const void* src) {  // all 16 bytes read
  const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int PENDING>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory");
}

}  // namespace detail
}  // namespace softmax_harness
