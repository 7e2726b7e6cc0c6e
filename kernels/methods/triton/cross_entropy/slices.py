"""The ``triton`` cross-entropy's slices path (Gluon; 16-bit rows of more than HYBRID_MAX_N columns, on a
GPU): the hybrid row kernel (:mod:`.gluon`) over slices of a row, which trade their
partial (max, sum of exp) like the split path's chunks (``kernels._ce_split_kernel``).

Algorithm. A row of V columns is cut into S = ceil(V / 65536) slices of SL = ceil(V / S) columns
rounded up to a multiple of 8 (every slice starts 16-byte aligned; the last one is V - (S - 1) SL
columns, at most 8 S fewer). One program per (row, slice), from a ticket counter (``CNT[0]``, an
atomic): a row's slices start in ticket order, so a waiting program only waits for programs that are
already running (no deadlock while S programs fit the GPU at once; S <= MAX_SLICES). A program loads
its slice once as the hybrid kernel loads a row (its first HYBRID_REG_VECS vectors per thread in
registers, the rest in shared memory by cp.async) and takes the slice's max m_p, the sum s_p of
exp(x - m_p) and the target's logit when the target lies in the slice (``_ce_row_stats``); publishes
(m_p, s_p) to an fp32 workspace; arrives on the row's counter (``CNT[1 + row]``, acq_rel) and spins
(acquire) until the row's S slices have arrived; merges the partials into the row's (M, S_total); then
writes its slice's gradient c exp(x - M) / S_total (as exp(x - m_p) times exp(min(m_p - M, 0)): a
slice of only -inf logits takes m_p = 0, maybe above M, and its gradient stays 0, as in the split
path), the target's element c (p_t - 1) by the thread that wrote it (``_ce_grad_pass``). The slice
holding the target writes the row's loss (slice 0 for ignored or out-of-range targets: 0 and NaN, as
the other paths). Each slice reads and writes only its own columns, and the target's logit is taken
before any write: the gradient may overwrite the logits.

Counters. One zeroed int32 buffer per device and stream, grown as needed, and left zeroed by the kernel
itself: the program that takes the last ticket resets the ticket counter, and each program departs
from its row's counter after its wait (one more atomic add) so that the row's last departure (the
count 2 S - 1 before it) resets the row's counter. No memset per call and no host-device sync. While
a CUDA graph is being captured the counters are a fresh zeroed tensor instead (captured as a memset:
correct on every replay, the cached buffer never allocated from the graph's pool).

Bytes: one read and, with the gradient, one write per element (the one-read-one-write ideal) plus 8
bytes of partials per slice; the stream path it replaces reads the logits twice (0.59 of copy on the
H200 at V = 128256-262144). Measured on the H200 (docs/perf.md): 0.83 of copy at V = 128256 (2
slices) and 262144 (4), 8 warps; at 8 warps a slice of 64K columns takes 112 KB of shared memory (one
program per SM), yet one more slice (two programs an SM) measured 0.76, twice as many 0.70, and 16
warps 0.65-0.75 (``python -m harness.bench triton-ce-sweep`` times them all). The kernel is defined only
where this Triton has Gluon; ``slices_unusable`` says when it cannot run.
"""

from __future__ import annotations

from typing import Optional

import torch

from kernels.methods.triton.softmax import plan as tp
from kernels.runtime.availability import gl, gluon, interpreter_enabled
from kernels.methods.triton.cross_entropy.gluon import HYBRID_MAX_N, _softmax_plan, hybrid_maxnreg

#: Longest slice (its shared part as the hybrid path's longest row); rows longer than this take slices.
SLICE_MAX_N = HYBRID_MAX_N
#: Most slices per row (each a resident program while the row waits): rows up to 4M columns.
MAX_SLICES = 64

if gluon is not None:
    from kernels.methods.triton.cross_entropy.gluon import _LOG2E, _ce_grad_pass, _ce_row_stats, _ce_scale
    from kernels.methods.triton.softmax.gluon import _hybrid_copy, _hybrid_words, _ring_start

    if hasattr(gl, "barrier"):  # (Triton 3.7 renamed thread_barrier)
        @gluon.jit
        def _cta_barrier():
            gl.barrier()
    else:
        @gluon.jit
        def _cta_barrier():
            gl.thread_barrier()

    @gluon.jit
    def _slice_exchange(CNT_ROW, stat, part, n_slices, m, s, SP2: gl.constexpr, LP: gl.constexpr):
        """Publish this slice's (m, s) to stat (the row's partials: n_slices maxima, then the sums), wait
        until every slice of the row has, and return the row's (reference, sum of exp(x - reference)).
        The barrier first: every thread's stores precede the release (scalar stores and atomics are
        thread 0's; the barrier keeps that an implementation detail). Then depart: the row's last
        departure (count 2 n_slices - 1 before it) leaves the counter 0 for the next launch."""
        gl.store(stat + part, m)
        gl.store(stat + n_slices + part, s)
        _cta_barrier()
        cnt = gl.atomic_add(CNT_ROW, 1, sem="acq_rel") + 1  # arrive (release: the partials above)
        while cnt < n_slices:
            cnt = gl.atomic_add(CNT_ROW, 0, sem="acquire")
        p = gl.arange(0, SP2, layout=LP)
        ms = gl.load(stat + p, mask=p < n_slices, other=float("-inf"), cache_modifier=".cg")
        ss = gl.load(stat + n_slices + p, mask=p < n_slices, other=0.0, cache_modifier=".cg")
        if gl.atomic_add(CNT_ROW, 1, sem="relaxed") == 2 * n_slices - 1:  # depart; the last one resets
            gl.atomic_xchg(CNT_ROW, 0, sem="relaxed")
        big_m = gl.max(ms, axis=0)
        big_ref = gl.where(big_m == float("-inf"), 0.0, big_m)
        # slices of only -inf (m -inf, s 0) add nothing; NaN stays NaN
        big_s = gl.sum(gl.where(ms == float("-inf"), 0.0, ss * gl.exp2((ms - big_ref) * _LOG2E)), axis=0)
        return big_ref, big_s

    @gluon.jit(do_not_specialize=["zero"])  # (never a constant 0 the compiler could fold)
    def _ce_slices_kernel(
        X, T, LOSS, G, S, C, XW, GW, CNT, STAT, n_vec, slice_vec, n_slices, stride_v, stride_gv, stride_s,
        ignore_index, zero,
        NR: gl.constexpr, NS: gl.constexpr, EVEN: gl.constexpr, BF16: gl.constexpr, SP2: gl.constexpr,
        FROM_S: gl.constexpr, DIVIDE: gl.constexpr, WRITE_LOSS: gl.constexpr, WRITE_GRAD: gl.constexpr,
    ):
        """Loss row and gradient of one (row, slice) (see the module docstring); arguments as
        ``_ce_hybrid_kernel``'s, plus CNT (int32: the ticket, then one counter per row, all 0), STAT
        (fp32, 2 n_slices per row), slice_vec (a slice's length in 8-element vectors; the last one
        is shorter or equal), n_slices and SP2 (a power of two >= n_slices). NR, NS, EVEN: the
        hybrid shape of a slice of slice_vec vectors (EVEN: every slice exactly that long)."""
        W: gl.constexpr = gl.num_warps()
        NT: gl.constexpr = 32 * W
        VEC: gl.constexpr = 8
        L2: gl.constexpr = gl.BlockedLayout([1, VEC], [32, 1], [W, 1], [1, 0])  # thread t: one 16-byte vector
        LT: gl.constexpr = gl.SliceLayout(1, L2)
        L3: gl.constexpr = gl.BlockedLayout([1, NR, 4], [32, 1, 1], [W, 1, 1], [2, 1, 0])  # thread t: NR x 4 words
        LP: gl.constexpr = gl.BlockedLayout([1], [32], [W], [0])
        buf, tid, tv, offs, mine = _ring_start(X, NS, VEC, NT, L2)  # (first: the buffer at offset 0)
        vid = gl.atomic_add(CNT, 1, sem="relaxed")  # the ticket
        if vid == gl.num_programs(0) - 1:  # the last ticket: no program takes one after it
            gl.atomic_xchg(CNT, 0, sem="relaxed")
        row = (vid // n_slices).to(gl.int64)
        part = vid % n_slices
        c0 = part * slice_vec  # the slice's first vector
        n_cols = gl.minimum(slice_vec, n_vec - c0) * VEC  # the slice's columns
        col0 = c0 * VEC
        _hybrid_copy(mine, X + row * (stride_v * VEC) + col0, n_cols, tv, NR * NT * VEC, NT, VEC, NS, EVEN, LT)
        offw = _hybrid_words(NT, NR, L3)
        w = gl.load(XW + row * (stride_v * 4) + c0 * 4 + offw)
        t = gl.load(T + row)
        t32 = gl.where((t >= col0) & (t < col0 + n_cols), t - col0, -1).to(gl.int32)  # in this slice; -1: not here
        m, ref, s, xt = _ce_row_stats(w, buf, tid, tv, offs, t32, n_cols, zero, NR, NS, EVEN, BF16, L2, L3)
        big_ref, big_s = _slice_exchange(CNT + 1 + row, STAT + row * (2 * n_slices), part, n_slices, m, s, SP2, LP)
        # the target's column in the row (-1: ignored, -2: outside [0, V)), read again (fewer live registers)
        t = gl.load(T + row)
        tg = gl.where(t == ignore_index, -1, gl.where((t < 0) | (t >= n_vec * VEC), -2, t)).to(gl.int32)
        if WRITE_LOSS:  # by the slice that holds the target (slice 0 for ignored and out-of-range targets)
            loss = gl.where(tg == -2, float("nan"), (big_ref - xt) + gl.log(big_s))
            gl.store(LOSS + row, gl.where(tg == -1, 0.0, loss), mask=gl.where(tg >= 0, t32 >= 0, part == 0))
        if WRITE_GRAD:
            c = gl.where(tg == -1, 0.0, _ce_scale(S, C, row, stride_s, FROM_S, DIVIDE))
            inv = c / gl.where(big_s == 0.0, 1.0, big_s)
            f = gl.exp2(gl.minimum((ref - big_ref) * _LOG2E, 0.0)) * inv
            _ce_grad_pass(GW + row * (stride_gv * 4) + c0 * 4, G + row * (stride_gv * VEC) + col0, w, buf, tid, offw,
                          offs, t32, gl.exp2((xt - big_ref) * _LOG2E) * inv - c, ref, f, n_cols, zero, NR, NS, EVEN,
                          BF16, L2)


def default_slices(n_cols: int) -> int:
    """Slices of a row: the fewest of at most SLICE_MAX_N columns."""
    return max(2, -(-n_cols // SLICE_MAX_N))


def slices_shape(n_cols: int, n_slices: int, num_warps: int) -> tuple[int, int, int, int, bool]:
    """(slice length, the last slice's length, vectors per thread in registers, in shared memory, EVEN:
    every slice covers its registers and shared vectors exactly) of rows of n_cols columns in n_slices
    slices. The kernel masks a slice's last shared vector only: see ``slices_reason``."""
    sl = -(-(-(-n_cols // n_slices)) // 8) * 8
    last = n_cols - (n_slices - 1) * sl
    nr, ns, even = tp._hybrid_shape(sl, _softmax_plan(num_warps))
    return sl, last, nr, ns, even and last == sl


def slices_reason(n_cols: int, n_slices: int, num_warps: int) -> Optional[str]:
    """Why rows of n_cols columns cannot be cut into n_slices slices for programs of num_warps warps
    (None: they can); the row length and shape arithmetic only, no tensor."""
    name = "the slices path"
    if n_cols <= SLICE_MAX_N:
        return f"{name} takes rows of more than {SLICE_MAX_N} columns, not {n_cols}"
    if n_cols % 8:
        return f"{name} needs 16-byte aligned rows (a column count that is a multiple of 8, not {n_cols})"
    if not 2 <= n_slices <= MAX_SLICES:
        return f"{name} cuts a row into 2 to {MAX_SLICES} slices, not {n_slices}"
    sl, last, nr, ns, _ = slices_shape(n_cols, n_slices, num_warps)
    if sl > SLICE_MAX_N:
        return f"{name}'s slices of {sl} columns are longer than {SLICE_MAX_N}"
    threads = 32 * num_warps
    if ns <= 0:
        return f"{name}'s slices of {sl} columns are no longer than the {nr * threads * 8} its registers hold"
    if last < (nr + ns - 1) * threads * 8:  # (its registers' part and every shared vector but the last inside)
        return (f"{name}'s last slice of {last} columns (slices of {sl}) is shorter than the "
                f"{(nr + ns - 1) * threads * 8} a program of {num_warps} warps needs")
    return None


def slices_unusable(logits: torch.Tensor, grad: Optional[torch.Tensor], num_warps: int,
                    n_slices: Optional[int] = None) -> Optional[str]:
    """Why the slices path (n_slices: None for ``default_slices``) cannot take these rows (None: it can):
    a Gluon kernel (GPU only, not in Triton's interpreter), the slices' arithmetic (``slices_reason``),
    the gradient in the logits' dtype, 16-byte aligned rows (logits and gradient) and a slice's shared
    part within this GPU's shared memory per block, fewer than 2^31 programs."""
    name = "the slices path"
    if interpreter_enabled():
        return f"{name} is a Gluon kernel: it does not run in Triton's interpreter"
    n_rows, v = logits.shape
    n_slices = n_slices or default_slices(v)
    why = slices_reason(v, n_slices, num_warps)
    if why:
        return why
    if n_rows * n_slices >= 2**31:
        return f"{name}: too many (row, slice) programs for one launch ({n_rows} x {n_slices})"
    if grad is not None and grad.dtype != logits.dtype:
        return f"{name} writes the gradient in the logits' dtype"
    sl = slices_shape(v, n_slices, num_warps)[0]
    return tp.gluon_unusable(logits, False, _softmax_plan(num_warps), grad, n_cols=sl, name=name)


_COUNTERS: dict = {}


def _counters(device: torch.device, n: int) -> torch.Tensor:
    """At least n int32 counters, all 0 (see the module docstring): the device's and current stream's
    cached buffer (the kernel leaves it zeroed), or a fresh one while a CUDA graph is being captured."""
    if torch.cuda.is_current_stream_capturing():
        return torch.zeros(n, dtype=torch.int32, device=device)
    key = (device, torch.cuda.current_stream(device).cuda_stream)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < n:  # (the old buffer is freed in stream order: its launches finish first)
        buf = _COUNTERS[key] = torch.zeros(max(n, 2 * (0 if buf is None else buf.numel())), dtype=torch.int32,
                                           device=device)
    return buf


def launch_slices(logits, targets, loss_rows, grad, scale, count, stride_s: int, ignore_index: int, num_warps: int,
                  n_slices: int, flags: dict) -> None:
    """The slices kernel over every row (arguments as ``launch_hybrid``'s, and the slices per row;
    ``slices_unusable`` must have said None)."""
    n_rows, n_cols = logits.shape
    sl, _, nr, ns, even = slices_shape(n_cols, n_slices, num_warps)
    g = logits if grad is None else grad
    cnt = _counters(logits.device, n_rows + 1)
    stat = torch.empty(n_rows * 2 * n_slices, dtype=torch.float32, device=logits.device)
    _ce_slices_kernel[(n_rows * n_slices,)](
        logits, targets, logits if loss_rows is None else loss_rows, g, logits if scale is None else scale,
        logits if count is None else count, logits.view(torch.int32), g.view(torch.int32), cnt, stat, n_cols // 8,
        sl // 8, n_slices, logits.stride(0) // 8, g.stride(0) // 8, stride_s, ignore_index, 0, NR=nr, NS=ns,
        EVEN=even, BF16=logits.dtype == torch.bfloat16, SP2=tp._next_pow2(n_slices), num_warps=num_warps,
        maxnreg=hybrid_maxnreg(num_warps), **flags)
