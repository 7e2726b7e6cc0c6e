"""The ``triton`` cross-entropy's hybrid path (Gluon; 16-bit rows of HYBRID_MIN_N + 1 .. HYBRID_MAX_N
columns, on a GPU): the softmax's hybrid forward (``gluon._fwd_hybrid_kernel``) turned into the
cross-entropy row kernel of ``kernels._ce_tile_kernel``'s contract.

Algorithm. One program per row (num_warps 16: 512 threads). Thread t keeps the 16-byte vectors t,
t + T, ... (HYBRID_REG_VECS of them) in registers as 32-bit words (two 16-bit logits each) and copies
its next NS vectors into shared memory with inline-PTX cp.async, read back only by the thread that
copied them (no block barrier; the buffer is the kernel's first shared allocation, at offset 0 where
the PTX addresses it). Three passes over the on-chip row, fp32: the max m; the sum s of exp(x - m)
and the target's logit x_t (the element whose column is the target, selected in that pass and
sum-reduced with s in one block reduction: never read again from memory, so the gradient may be
written over the logits); then, with WRITE_GRAD, the gradient c * softmax in the logits' dtype, and
the target's element c * (p_t - 1) once more by the thread that wrote it (no compare per element in
that pass). The target's position is compared with per-thread offsets, so the columns of the row are
never held in registers (that spilled). Each pass reads the shared part at slot i + k * zero (zero: a run-time 0, the softmax
kernel's trick that keeps the compiler from holding the shared part in registers across passes).
The loss (m - x_t) + log s (0 on ignored rows, NaN for a target outside [0, V)), the scale c as
``_scale_of`` (grad_output and/or 1 / n_valid; 0 on ignored rows), -inf logits and rows of all -inf
as the tile kernel. At most 96 KB of shared memory and 64 registers per thread (maxnreg), so two
programs share an SM and one's reductions overlap the other's copies.

Bytes: the logits are read once (N V b) and, with WRITE_GRAD, the gradient written once (N V b): the
one-read-one-write ideal, 16384 x 50304 bf16 = 3.3 GB, 0.78 ms at the H200's ~4.2 TB/s copy. Measured
(H200, docs/perf.md): 0.95 of copy at V = 50304 with 8 warps (0.824 ms; 0.72 with 16), 0.95-0.97 at
65536; the stream path it replaced measured 0.59-0.63 (1.26 ms).
The kernel is defined only where this Triton has Gluon; ``hybrid_unusable`` says when it cannot run.
Its passes are helpers (``_ce_row_stats``: max, sum and target; ``_ce_grad_pass``; ``_ce_scale``),
shared with the slices path (:mod:`.slices`), which runs them over slices of longer rows.
"""

from __future__ import annotations

from typing import Optional

import torch

from kernels.methods.triton.softmax import plan as tp
from kernels.runtime.availability import gl, gluon, interpreter_enabled

#: Rows this path takes: HYBRID_MIN_N < V <= HYBRID_MAX_N (16-bit; the registers' part at 16 warps is
#: 16384 columns, the rest at most 96 KB of shared memory at 65536).
HYBRID_MIN_N = tp.HYBRID_MIN_N
HYBRID_MAX_N = tp.RING_MAX_N
HYBRID_WARPS = tp.HYBRID_WARPS

if gluon is not None:
    from kernels.methods.triton.softmax.gluon import (_hybrid_copy, _hybrid_keys, _hybrid_words, _pack, _ring_start,
                                                      _ring_wait, _unpack)

    _LOG2E = gl.constexpr(1.4426950408889634)

    @gluon.jit
    def _add2(a0, b0, a1, b1):
        return a0 + a1, b0 + b1

    @gluon.jit
    def _ce_row_stats(w, buf, tid, tv, offs, t32, n_cols, zero, NR: gl.constexpr, NS: gl.constexpr,
                      EVEN: gl.constexpr, BF16: gl.constexpr, L2: gl.constexpr, L3: gl.constexpr):
        """Passes 1 and 2 over an on-chip row of n_cols columns (the registers' words w, the shared part
        buf, its copy in flight): (m, ref, s, x_t): the max (-inf for a row of -inf), ref (m, or 0 for a
        row of -inf), the sum of exp(x - ref) and the logit at column t32 (0 for t32 < 0)."""
        W: gl.constexpr = gl.num_warps()
        NT: gl.constexpr = 32 * W
        VEC: gl.constexpr = 8
        S0: gl.constexpr = NR * NT * VEC  # first column of the shared part
        LT: gl.constexpr = gl.SliceLayout(1, L2)
        # pass 1: the max
        lo, hi = _unpack(w, BF16)
        m_t = gl.convert_layout(gl.max(gl.max(gl.maximum(lo, hi), axis=2), axis=1), LT)
        _ring_wait(tid, 0)
        for i in gl.static_range(NS):
            key = _hybrid_keys(buf, i, 0, offs, n_cols, 1.0, S0, NT, VEC, NS, EVEN, L2)
            m_t = gl.maximum(m_t, gl.max(key, axis=1))
        m = gl.max(m_t, axis=0)
        ref = gl.where(m == float("-inf"), 0.0, m)  # no finite logit: every exponential below is 0
        # pass 2: the sum of exponentials and the target's logit (one block reduction)
        lo, hi = _unpack(w, BF16)
        s_t = gl.convert_layout(gl.sum(gl.sum(gl.exp2((lo - ref) * _LOG2E) + gl.exp2((hi - ref) * _LOG2E), axis=2),
                                       axis=1), LT)
        # the target's logit: its word and element compared with per-thread offsets (a compare of every
        # element's column would keep the columns in registers)
        i3 = gl.arange(0, NR, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))
        j3 = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))
        dw = (t32 >> 1) - gl.arange(0, NT, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3))) * 4
        hit = (i3[None, :, None] * (NT * 4) + j3[None, None, :]) == dw[:, None, None]
        x_t = gl.convert_layout(gl.sum(gl.sum(gl.where(hit, gl.where((t32 & 1) == 1, hi, lo), 0.0), axis=2), axis=1), LT)
        jv = gl.arange(0, VEC, layout=gl.SliceLayout(0, L2))
        dv = t32 - S0 - tv  # the target's column from this thread's first shared vector
        for i in gl.static_range(NS):
            key = _hybrid_keys(buf, i, zero, offs, n_cols, 1.0, S0, NT, VEC, NS, EVEN, L2)
            s_t = s_t + gl.sum(gl.exp2((key - ref) * _LOG2E), axis=1)
            x_t = x_t + gl.sum(gl.where(jv[None, :] == (dv - i * NT * VEC)[:, None], key, 0.0), axis=1)
        s, xt = gl.reduce((s_t, x_t), 0, _add2)
        return m, ref, s, xt

    @gluon.jit
    def _ce_grad_pass(gw_row, g_row, w, buf, tid, offw, offs, t32, g_t, ref, f, n_cols, zero, NR: gl.constexpr,
                      NS: gl.constexpr, EVEN: gl.constexpr, BF16: gl.constexpr, L2: gl.constexpr):
        """Pass 3: the gradient exp(x - ref) * f of the on-chip row at g_row (gw_row: the same as 32-bit
        words), then g_t at column t32 (t32 >= 0) by the thread that wrote that column with the others
        (vector v is thread v % NT's in both parts; one thread's stores to one address land in program
        order): no compare per element here."""
        W: gl.constexpr = gl.num_warps()
        NT: gl.constexpr = 32 * W
        VEC: gl.constexpr = 8
        S0: gl.constexpr = NR * NT * VEC
        LT: gl.constexpr = gl.SliceLayout(1, L2)
        owner = (tid == (t32 >> 3) % NT) & (t32 >= 0)
        g_t = (gl.zeros([NT], gl.float32, LT) + g_t).to(g_row.dtype.element_ty)
        lo, hi = _unpack(w, BF16)
        gl.store(gw_row + offw, _pack(gl.exp2((lo - ref) * _LOG2E) * f, gl.exp2((hi - ref) * _LOG2E) * f, BF16))
        for i in gl.static_range(NS):
            key = _hybrid_keys(buf, i, 2 * zero, offs, n_cols, 1.0, S0, NT, VEC, NS, EVEN, L2)
            g = (gl.exp2((key - ref) * _LOG2E) * f).to(g_row.dtype.element_ty)
            if EVEN or i < NS - 1:
                gl.store(g_row + S0 + i * NT * VEC + offs, g)
            else:
                gl.store(g_row + S0 + i * NT * VEC + offs, g, mask=offs < n_cols - (S0 + i * NT * VEC))
        gl.store(g_row + gl.where(owner, t32, 0), g_t, mask=owner)

    @gluon.jit
    def _ce_scale(S, C, row, stride_s, FROM_S: gl.constexpr, DIVIDE: gl.constexpr):
        """The gradient scale of a row before an ignored row is zeroed (``_scale_of``)."""
        if FROM_S:
            c = gl.load(S + row * stride_s).to(gl.float32)
        else:
            c = (row * 0 + 1).to(gl.float32)
        if DIVIDE:
            c = c / gl.maximum(gl.load(C), 1.0)
        return c

    @gluon.jit(do_not_specialize=["zero"])  # (never a constant 0 the compiler could fold)
    def _ce_hybrid_kernel(
        X, T, LOSS, G, S, C, XW, GW, n_vec, stride_v, stride_gv, stride_s, ignore_index, zero,
        NR: gl.constexpr, NS: gl.constexpr, EVEN: gl.constexpr, BF16: gl.constexpr, FROM_S: gl.constexpr,
        DIVIDE: gl.constexpr, WRITE_LOSS: gl.constexpr, WRITE_GRAD: gl.constexpr,
    ):
        """Loss row and gradient of one row (see the module docstring). XW, GW: the logits and the
        gradient viewed as int32; n_vec, stride_v, stride_gv: the row length and the row strides in
        8-element vectors (every row 16-byte aligned); T: int64 targets; S, C: grad_output and n_valid
        (read with FROM_S, DIVIDE)."""
        W: gl.constexpr = gl.num_warps()
        NT: gl.constexpr = 32 * W
        VEC: gl.constexpr = 8
        S0: gl.constexpr = NR * NT * VEC  # first column of the shared part
        L2: gl.constexpr = gl.BlockedLayout([1, VEC], [32, 1], [W, 1], [1, 0])  # thread t: one 16-byte vector
        LT: gl.constexpr = gl.SliceLayout(1, L2)
        L3: gl.constexpr = gl.BlockedLayout([1, NR, 4], [32, 1, 1], [W, 1, 1], [2, 1, 0])  # thread t: NR x 4 words
        buf, tid, tv, offs, mine = _ring_start(X, NS, VEC, NT, L2)
        row = gl.program_id(0).to(gl.int64)
        n_cols = n_vec * VEC
        _hybrid_copy(mine, X + row * (stride_v * VEC), n_cols, tv, S0, NT, VEC, NS, EVEN, LT)
        offw = _hybrid_words(NT, NR, L3)
        w = gl.load(XW + row * (stride_v * 4) + offw)
        t = gl.load(T + row)
        # the target's column; -1: ignored, -2: outside [0, V) (one int32 kept, not the int64 and flags)
        t32 = gl.where(t == ignore_index, -1, gl.where((t < 0) | (t >= n_cols), -2, t)).to(gl.int32)
        m, ref, s, xt = _ce_row_stats(w, buf, tid, tv, offs, t32, n_cols, zero, NR, NS, EVEN, BF16, L2, L3)
        if WRITE_LOSS:
            loss = gl.where(t32 == -2, float("nan"), (ref - xt) + gl.log(s))
            gl.store(LOSS + row, gl.where(t32 == -1, 0.0, loss))
        if WRITE_GRAD:
            c = gl.where(t32 == -1, 0.0, _ce_scale(S, C, row, stride_s, FROM_S, DIVIDE))
            f = c / gl.where(s == 0.0, 1.0, s)
            _ce_grad_pass(GW + row * (stride_gv * 4), G + row * (stride_gv * VEC), w, buf, tid, offw, offs, t32,
                          gl.exp2((xt - ref) * _LOG2E) * f - c, ref, f, n_cols, zero, NR, NS, EVEN, BF16, L2)


def hybrid_maxnreg(num_warps: int) -> int:
    """Registers per thread: 64 at 16 warps, as the softmax's hybrid (two programs of 512 threads fill an
    SM's 64K registers), 128 at 8 warps (two programs of 256 threads, the same total)."""
    return tp.HYBRID_MAX_REGS * HYBRID_WARPS // num_warps


def _softmax_plan(num_warps: int) -> tp.Plan:
    """The softmax's hybrid plan of these warps (its shape arithmetic and checks are this kernel's)."""
    return tp.Plan(False, 0, 1, num_warps, hybrid=True)


def hybrid_unusable(logits: torch.Tensor, grad: Optional[torch.Tensor], num_warps: int = HYBRID_WARPS) -> Optional[str]:
    """Why the hybrid path cannot take these rows (None: it can): a Gluon kernel (GPU only, not in
    Triton's interpreter), 16-bit rows of HYBRID_MIN_N + 1 .. HYBRID_MAX_N columns, copied in 16-byte
    vectors (the logits' and the gradient's rows and row strides 16-byte aligned, column stride 1), the
    shared part within this GPU's shared memory per block. (Causal rows: not a cross-entropy case.)"""
    if interpreter_enabled():
        return "the hybrid path is a Gluon kernel: it does not run in Triton's interpreter"
    v = logits.shape[1]
    if not HYBRID_MIN_N < v <= HYBRID_MAX_N:
        return f"the hybrid path takes rows of {HYBRID_MIN_N + 1} to {HYBRID_MAX_N} columns, not {v}"
    if grad is not None and grad.dtype != logits.dtype:
        return "the hybrid path writes the gradient in the logits' dtype"
    return tp.gluon_unusable(logits, False, _softmax_plan(num_warps), grad)


def launch_hybrid(logits, targets, loss_rows, grad, scale, count, stride_s: int, ignore_index: int, num_warps: int,
                  flags: dict) -> None:
    """The hybrid kernel over every row (arguments as ``launch.launch_ce`` prepares them:
    None where a buffer is not read or written; ``hybrid_unusable`` must have said None)."""
    n_rows, n_cols = logits.shape
    nr, ns, even = tp._hybrid_shape(n_cols, _softmax_plan(num_warps))
    g = logits if grad is None else grad
    xw, gw = logits.view(torch.int32), g.view(torch.int32)
    _ce_hybrid_kernel[(n_rows,)](
        logits, targets, logits if loss_rows is None else loss_rows, g, logits if scale is None else scale,
        logits if count is None else count, xw, gw, n_cols // 8, logits.stride(0) // 8, g.stride(0) // 8, stride_s,
        ignore_index, 0, NR=nr, NS=ns, EVEN=even, BF16=logits.dtype == torch.bfloat16, num_warps=num_warps,
        maxnreg=hybrid_maxnreg(num_warps), **flags)
