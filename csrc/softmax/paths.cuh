// Device side of the fused scale + causal mask + softmax kernels (CUDA C++, no torch header): the
// kernels and their helpers, as templates, one header per code path, all included here. This comment
// is the one list of the code paths (other files point here). The host-side launchers are in
// launch.cuh (included by the .cu files only): softmax_kernels.cu (the launch table and the dispatch)
// and softmax_tuning*.cu (the variants the launch table was chosen from).
//
// Files: common.cuh (types, conversions, vector loads, reductions, row indexing, the fill of masked
// columns, the row math on packed words, cp.async: shared by the paths), cluster.cuh (exchanges over
// a thread-block cluster), split.cuh (exchanges through global memory), register.cuh (the register
// kernels, which also run the cluster and split paths), persist.cuh, hybrid.cuh, stream.cuh.
//
// Code paths:
//  * register: the row stays in registers (loaded with 16-byte vectors, all of a thread's loads issued
//    before the first is used, fp32 math). L threads share a row, NV vectors (ITEMS = NV * VEC
//    elements) each: L <= 32 packs several rows into one warp (short rows), L > 32 is a block per row.
//    One pass over memory each way. Two reduction schemes: MERGED = false
//    reduces the row max, then exponentiates once per element and reduces the sum (two reductions);
//    MERGED = true exponentiates against its warp's max and combines the warps' (max, sum) pairs after
//    one barrier (online-softmax merge, merged_stats), rescaling each element once at the end.
//  * cluster: the register kernel with SPAN = kCluster: a long row is split over a thread-block cluster
//    (Hopper, up to 16 CTAs); each CTA keeps its slice in registers and the CTAs exchange their
//    partials once through distributed shared memory (stores into each peer's slots plus an mbarrier
//    arrival there: no cluster-wide barrier on the critical path). Still one pass over memory each way.
//  * split: the register kernel with SPAN = kSplit: a long row is split over ordinary blocks, one slice
//    each, that combine their partials through global memory: each block publishes its slice's partial,
//    counts itself in the row's arrival counter (release) and waits until every slice of the row has
//    arrived (acquire). Blocks take their slice from a ticket counter, so the slices of a row start in
//    ticket order and a waiting block only ever waits for blocks already running: no deadlock while a
//    row's slices fit on the GPU at once (the host caps them at kMaxSplits). No cluster-scheduling
//    constraints, several blocks per SM; one pass over memory each way.
//  * persist: a block per SM loops over rows (one row at a time, L threads); each thread prefetches
//    its own 16-byte vectors of the next B rows into shared memory with cp.async (B buffers), so the
//    loads of later rows are in flight while this row is reduced and written: one long row per SM no
//    longer leaves the memory system idle between rows. A thread reads back only what it copied: no
//    barrier for the staging. The first row is loaded straight into registers. Full rows (exactly the
//    tile, not causal) run a copy of the loop without per-vector checks. C > 1: the row over a
//    cluster of C CTAs, one exchange per row (as above).
//  * hybrid: a 16-bit row too long for one block's registers, a block per row: part of it in registers
//    (packed), the rest copied into shared memory with cp.async by the thread that reads it back (no
//    barrier for the staging); two blocks per SM, so one's reduction overlaps the other's memory
//    traffic. One pass over memory each way.
//  * stream: rows of any length (no cap) and unaligned rows: a block per row, two passes over global
//    memory, the second walking backwards so the chunks read last (still in L2) come first.
// Register, cluster, split, persist and hybrid paths need 16-byte alignment (cols and the row stride
// multiples of the vector width, aligned base pointers). Causal rows load only their unmasked prefix
// and write zeros after it; on the forward's register, cluster, split, persistent and hybrid paths the
// masked columns read as a fill whose scaled score is -inf (see fill_word), so the math after the
// loads carries no per-element mask.
// Math in fp32 with exp2; maxima on the keys x * sign(c), exponents (x - max * sign(c)) * c, exactly
// 0 at the max at any magnitude (see sign_of); NaN propagates within its row; a row with no unmasked
// key (or all -inf) gives zeros.
#pragma once

#include "common.cuh"
#include "cluster.cuh"
#include "split.cuh"
#include "register.cuh"
#include "persist.cuh"
#include "hybrid.cuh"
#include "stream.cuh"
