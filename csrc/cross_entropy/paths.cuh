// Device side of the fused cross-entropy kernels (CUDA C++, no torch header): the kernels, one header
// per code path, all included here. This comment is the one list of the code paths (other files point
// here). The host-side launchers are in launch.cuh (included by the .cu files only):
// cross_entropy_kernels.cu (the launch table and the dispatch) and cross_entropy_tuning*.cu (the
// variants the launch table is chosen from, `python -m harness.bench cuda-ce-sweep`).
//
// What a launch computes, per row r of logits x (rows, V), target t = targets[r]:
//   loss[r] = logsumexp(x[r]) - x[r, t]                  (fp32; 0 where t == ignore_index)
//   grad[r] = (softmax(x[r]) - onehot(t)) * s[r]         (only with a gradient buffer; 0 where ignored)
// with s the gradient scale: 1, a device scalar (e.g. 1 / n_valid for a mean) or one per row. The
// gradient buffer may be the logits themselves (in place): every element is read (by the thread that
// writes it) before it is written, and the target logit is taken from that thread's registers.
// A target outside [0, V) that is not ignore_index gives loss NaN and gradient row NaN and is recorded
// in an error word (CeParams::err: the first bad row, its target and V) that the host reads only when
// asked (cross_entropy_kernels.h: ce_take_error); no host sync on the normal path.
//
// Files: common.cuh (launch arguments, the row's target, the row statistics), rows.cuh (the on-chip
// kernel: register, hybrid and split paths), stream.cuh, scale.cuh (the backward's scale).
//
// Code paths:
//  * register: the row stays in registers (16-byte vector loads, all of a thread's loads issued before
//    the first is used, fp32 math with exp2). L threads share a row, NR vectors each: L <= 32 packs
//    several rows into a warp (short rows), L > 32 is a block per row. One merged (max, sum) reduction
//    (a barrier when L > 32). PACKED: the row stays as loaded (16-bit pairs: half the registers) and
//    each exponential is computed twice (for the sum and for the gradient); else the exponentials are
//    kept in fp32. One read of the row, one write of the gradient.
//  * hybrid: the same kernel with NSV more vectors per thread staged in shared memory (cp.async by the
//    thread that reads them back: no barrier for the staging), a block per row, two blocks per SM, so
//    one block's reduction overlaps the other's memory traffic (16-bit rows too long for one block's
//    registers). One read, one write.
//  * split: the register or hybrid kernel over `splits` blocks per row, each holding a slice of
//    ceil(V / splits) columns (balanced, rounded to the vector width); the blocks publish their slice's
//    (max, sum) in a workspace in global memory, count themselves in the row's arrival counter and
//    wait for the row's other slices (softmax/split.cuh). Blocks take their slice from a ticket
//    counter, so a row's slices start in ticket order and a waiting block only waits for blocks that
//    already run: no deadlock while a row's slices fit on the GPU at once (the host caps the slices at
//    min(kMaxSplits, SMs)). One read, one write.
//  * stream: rows of any length (no cap) or alignment: a block per row, two passes over the row (an
//    online max/sum, then the gradient, the second pass walking backwards so the chunks read last,
//    still in L2, come first). Two reads (the second partly from L2), one write.
// Register, hybrid and split paths need 16-byte alignment: V and the row strides multiples of the
// vector width, aligned base pointers (else the stream path).
// Numerics: fp32 math, exponentials exp2((x - max) * log2 e) with the max taken on the loaded values
// (exact), so large logits (1e4) do not overflow and the target's term is exactly 1 at the max; -inf
// logits contribute exactly 0; NaN propagates within its row; a row whose logits are all -inf gives
// loss NaN (logsumexp is -inf there).
#pragma once

#include "common.cuh"
#include "rows.cuh"
#include "scale.cuh"
#include "stream.cuh"
