"""`triton` cross-entropy kernels: the loss softmax over the vocabulary, forward and backward in one pass.

Algorithm. Logits (N, V), any strides, targets (N,). One kernel reads each row once, on chip in fp32:
max m, sum s of exp(x - m), the target's logit x_t (a sum of the registers selected by the target's
column, never re-read from memory, so the kernel may write its gradient over its own input; a tuple
``tl.reduce`` could fuse it with the max on a GPU, but the interpreter runs those element by element),
loss = (m - x_t) + log s (0 where the target is ``ignore_index``). When the logits require grad the
same kernel writes the gradient c * (softmax - onehot) in the logits' dtype, c = 1 / n_valid for
'mean' (n_valid counted on the device and read by the kernel through a pointer: no host sync), 1 for
'sum' and 'none', 0 on ignored rows. The backward then only multiplies by grad_output
(``_scale_kernel``): each program reads grad_output from device memory and does nothing when it is
exactly 1 (the usual ``loss.backward()``), else scales the saved gradient in place (per row for
'none'). (Under torch.compile the backward recomputes the gradient instead, grad_output folded in:
see :mod:`kernels.methods.triton.cross_entropy`.) float16 keeps the gradient unscaled (c = 1) and
divides by n_valid in the backward: 1 / n_valid in fp16 pushes small probabilities into subnormals or
to zero before a GradScaler's factor could lift them.

Code paths by V (``plan``; the long rows' path and chunk from the H200 sweep, ``ce_sweep``; the
tile rows from the softmax forward's table):

* Tile (V <= ``TILE_MAX_N``): ROWS whole rows per program in registers (several rows per program for
  short rows). One read, one write per element.
* Split (``LONG_PATH = "split"``, V up to ``MAX_SPLITS`` chunks of ``SPLIT_BLOCK_N``; measured slower
  than stream on the H200, 0.35-0.53 of copy at V = 50304-262144, so not the default: its programs
  wait on each other holding their chunks): a row over several programs, each holding
  one chunk in registers. Each publishes its chunk's (max, sum of exp) to a workspace, bumps the row's
  arrival counter and waits for the row's other chunks, then combines the partials and writes its
  chunk's gradient; the chunk that holds the target writes the row's loss (the target logit never
  leaves its program). No deadlock: chunks take tickets from an atomic counter, so a row's chunks
  start in order and a waiting program only waits for programs that are already running (a row needs
  at most MAX_SPLITS resident programs). Triton's CPU interpreter runs programs one after another, so
  there the kernel runs as two launches (partials, then outputs). One read, one write per element.
* Stream (rows longer than TILE_MAX_N that the hybrid and slices paths cannot take, no cap): one
  program per row, an online pass (running max and rescaled sum per lane) and a gradient pass walking
  the row backwards, so the chunks read last by the first pass are still in L2. Reads the logits twice:
  0.59-0.63 of copy on the H200 (V = 50304-262144).
* Hybrid (the default for 16-bit rows of 16385-65536 columns, 16-byte aligned, on a GPU; else the
  stream path): one Gluon program of 8 warps per row, part of the row in registers, the rest in shared
  memory (:mod:`.cross_entropy_gluon`, the softmax's hybrid forward turned into this row kernel). One
  read, one write: 0.95 of copy at V = 50304 (0.824 ms for 16384 rows), 0.95-0.97 at 65536 (H200).
* Slices (the default for 16-bit rows of more than 65536 columns, a multiple of 8, up to
  ``MAX_SLICES`` x 65536, 16-byte aligned, on a GPU; else the stream path): a row cut into S =
  ceil(V / 65536) slices of about V / S columns, one Gluon program of 8 warps per slice holding it as
  the hybrid path holds a row, the slices of a row trading (max, sum of exp) through a workspace and an
  arrival counter as the split path's chunks (tickets, no deadlock) (:mod:`.cross_entropy_slices`).
  One read, one write: 0.83 of copy at V = 128256 and 262144 (H200: 1.144 ms for 7680 rows of 128256;
  more slices or 16 warps measured slower, 0.65-0.76).

Bytes (N x V logits of b bytes; H200 device-to-device copy ~4.2 TB/s): forward with gradient reads
N V b and writes N V b (the ideal: 16384 x 50304 bf16 is 3.3 GB, 0.78 ms, against 3.16 ms for
F.cross_entropy on bf16 logits and 2.16 ms for Liger; the tile path should reach 0.85-0.9 of copy;
the stream path reads twice, measured 1.24 ms there, 0.63 of copy); without
gradient it only reads. Backward: ~0 bytes when grad_output is 1 (one launch of 4 programs per SM
that each read one float and return), else 2 N V b (0.78 ms at that size). Compiled: forward N V b
(read only), backward 2 N V b. Small extra launches: the target count and range check (N x 8 bytes,
one program, ``_targets_kernel``), the loss reduction (N x 4, one program, 'mean'/'sum'; a copy for
'none'), a zeroed counter for the split path (the slices path's counters are a cached buffer its
kernel leaves zeroed: no memset) and 8 bytes of partials per chunk or slice. No host-device sync
anywhere on the path.

The torch ops and their autograd are in :mod:`kernels.methods.triton.cross_entropy`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

import triton
import triton.language as tl

from kernels.methods.triton.cross_entropy_gluon import (HYBRID_MAX_N, HYBRID_MIN_N, hybrid_unusable,
                                                        launch_hybrid)
from kernels.methods.triton.cross_entropy_slices import (default_slices, launch_slices, slices_reason, slices_shape,
                                                         slices_unusable)
from kernels.methods.triton.cross_entropy_reduction import (  # noqa: F401  (re-exported: the module's API)
    _device_guard, count_targets, reduce_loss, scale_grad_)
from kernels.methods.triton.tile import _split_arrive_and_wait, _split_chunk
from kernels.runtime import fastlaunch
from kernels.runtime.availability import interpreter_enabled, require_gpu_tensor


LOG2E = tl.constexpr(1.4426950408889634)  # a global a @jit function reads must be a constexpr
#: Rows up to this many columns are held whole in one program's registers (32 fp32 values per thread
#: at 16 warps; 32768 would need 32 warps at 64 registers a thread, one program per SM).
TILE_MAX_N = 16384
#: Rows longer than TILE_MAX_N: "hybrid" (16-bit rows of HYBRID_MIN_N + 1 .. HYBRID_MAX_N columns where
#: ``hybrid_unusable`` says None, the H200 sweep's winner in its range (``python -m
#: kernels.methods.triton.ce_sweep``; docs/perf.md: 0.95-0.97 of copy at V = 50304-65536, against 0.62
#: for the stream path); longer 16-bit rows: the slices path where ``slices_unusable`` says None
#: (0.83 at 128256-262144); the stream path elsewhere), "stream" (every long row: 0.59 of copy at
#: 128256-262144, against 0.35-0.53 for the split path's best) or "split" (tests force it).
LONG_PATH = "hybrid"
#: Hybrid path warps: 8 (the sweep: 0.824 ms at V = 50304 against 1.094 at 16 warps; 1.004 against
#: 0.986 at 65536).
HYBRID_CE_WARPS = 8
#: Slices path warps (8: as the hybrid path; the sweep also times 16, which spills a few registers).
SLICES_WARPS = 8
#: Split path: chunk length, warps, most chunks per row (each a resident program while the row waits).
SPLIT_BLOCK_N = 8192
SPLIT_WARPS = 8
MAX_SPLITS = 128
#: Stream path: chunk length and warps (the sweep: 2048 x 8 warps best at every V it timed).
STREAM_BLOCK_N = 2048
STREAM_WARPS = 8
#: Tile path (rows per program, warps) by block length: the softmax forward's H200 table (the same
#: bytes per element) as a start; other lengths: ~4096 elements per program.
_TILE = {128: (64, 8), 256: (16, 4), 512: (16, 16), 1024: (8, 16), 2048: (4, 16), 4096: (1, 8),
         8192: (1, 16), 16384: (1, 16)}


def validate(x: Tensor) -> None:
    require_gpu_tensor(x, "the triton cross-entropy")


# ------------------------------------------------------------------------------------------------
# kernels
# ------------------------------------------------------------------------------------------------
@triton.jit
def _scale_of(S, C, rows, row_ok, stride_s, FROM_S: tl.constexpr, DIVIDE: tl.constexpr):
    """The gradient scale of rows (a scalar row or a vector of rows) before ignored rows are zeroed:
    S[row * stride_s] (grad_output: per row, or one value with stride 0) or 1, divided by
    max(n_valid, 1) (C[0]) with DIVIDE."""
    if FROM_S:
        c = tl.load(S + rows.to(tl.int64) * stride_s, mask=row_ok, other=0.0).to(tl.float32)
    else:
        c = rows.to(tl.float32) * 0.0 + 1.0
    if DIVIDE:
        c = c / tl.maximum(tl.load(C), 1.0)
    return c


@triton.jit
def _row_loss(ref, xt, log_s, t, n_cols, valid):
    """(m - x_t) + log s; 0 for ignored rows, NaN for a target outside [0, V)."""
    bad = valid & ((t < 0) | (t >= n_cols))
    return tl.where(valid, tl.where(bad, float("nan"), (ref - xt) + log_s), 0.0)


@triton.jit
def _ce_tile_kernel(
    X, T, LOSS, G, S, C, n_rows, n_cols, stride_xr, stride_xc, stride_gr, stride_s, ignore_index,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, FROM_S: tl.constexpr, DIVIDE: tl.constexpr,
    WRITE_LOSS: tl.constexpr, WRITE_GRAD: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)[None, :]
    row_ok = rows < n_rows
    inside = row_ok[:, None] & (cols < n_cols)
    rows64 = rows.to(tl.int64)
    t = tl.load(T + rows, mask=row_ok, other=ignore_index)
    x = tl.load(X + rows64[:, None] * stride_xr + cols * stride_xc, mask=inside, other=float("-inf"))
    x = x.to(tl.float32)
    is_t = cols == t[:, None]
    m = tl.max(x, axis=1)
    xt = tl.sum(tl.where(is_t, x, 0.0), axis=1)
    ref = tl.where(m == float("-inf"), 0.0, m)  # a row of -inf: every exponential is 0
    e = tl.exp2((x - ref[:, None]) * LOG2E)  # columns past V: exp2(-inf) = 0
    s = tl.sum(e, axis=1)
    valid = t != ignore_index
    if WRITE_LOSS:
        tl.store(LOSS + rows, _row_loss(ref, xt, tl.log(s), t, n_cols, valid), mask=row_ok)
    if WRITE_GRAD:
        c = tl.where(valid, _scale_of(S, C, rows, row_ok, stride_s, FROM_S, DIVIDE), 0.0)
        g = e * (c / tl.where(s == 0.0, 1.0, s))[:, None] - tl.where(is_t, c[:, None], 0.0)
        tl.store(G + rows64[:, None] * stride_gr + cols, g.to(G.dtype.element_ty), mask=inside)


@triton.jit
def _ce_split_kernel(
    X, T, LOSS, G, S, C, CNT, STAT, n_cols, splits, stride_xr, stride_xc, stride_gr, stride_s, ignore_index,
    BLOCK_N: tl.constexpr, SPLITS_P2: tl.constexpr, FROM_S: tl.constexpr, DIVIDE: tl.constexpr,
    WRITE_LOSS: tl.constexpr, WRITE_GRAD: tl.constexpr, PHASE: tl.constexpr,
):
    """PHASE 0: the whole kernel, chunks from the ticket counter CNT[0] (GPU). PHASE 1: partials only;
    PHASE 2: outputs only (the interpreter, whose programs run one after another). The chunk and the
    arrival are the softmax split path's (``tile._split_chunk``, ``tile._split_arrive_and_wait``)."""
    row, part, cols, inside = _split_chunk(CNT, splits, n_cols, 1, 0, BLOCK_N, False, PHASE)
    t = tl.load(T + row)
    x = tl.load(X + row * stride_xr + cols * stride_xc, mask=inside, other=float("-inf")).to(tl.float32)
    is_t = cols == t
    m = tl.max(x, axis=0)
    xt = tl.sum(tl.where(is_t, x, 0.0), axis=0)
    ref = tl.where(m == float("-inf"), 0.0, m)
    e = tl.exp2((x - ref) * LOG2E)
    stat = STAT + row * (2 * splits)  # this row's partials: splits maxima, then splits sums
    if PHASE != 2:
        tl.store(stat + part, m)
        tl.store(stat + splits + part, tl.sum(e, axis=0))
    if PHASE == 0:  # publish, then wait for every chunk of the row
        _split_arrive_and_wait(CNT + 1 + row, splits)
    if PHASE != 1:
        p = tl.arange(0, SPLITS_P2)
        ms = tl.load(stat + p, mask=p < splits, other=float("-inf"), cache_modifier=".cg")
        ss = tl.load(stat + splits + p, mask=p < splits, other=0.0, cache_modifier=".cg")
        big_m = tl.max(ms, axis=0)
        big_ref = tl.where(big_m == float("-inf"), 0.0, big_m)
        big_s = tl.sum(tl.where(ms == float("-inf"), 0.0, ss * tl.exp2((ms - big_ref) * LOG2E)), axis=0)
        valid = t != ignore_index
        if WRITE_LOSS:  # the chunk that holds the target (chunk 0 for ignored or out-of-range targets)
            in_range = (t >= 0) & (t < n_cols)
            owner = tl.where(valid & in_range, t // BLOCK_N == part, part == 0)
            tl.store(LOSS + row, _row_loss(big_ref, xt, tl.log(big_s), t, n_cols, valid), mask=owner)
        if WRITE_GRAD:
            c = tl.where(valid, _scale_of(S, C, row, row >= 0, stride_s, FROM_S, DIVIDE), 0.0)
            # (an all -inf chunk's ref = 0 may sit above big_ref: clamped, its gradient stays 0, not NaN)
            f = tl.exp2(tl.minimum((ref - big_ref) * LOG2E, 0.0)) * (c / tl.where(big_s == 0.0, 1.0, big_s))
            g = e * f - tl.where(is_t, c, 0.0)
            tl.store(G + row * stride_gr + cols, g.to(G.dtype.element_ty), mask=inside)


@triton.jit
def _ce_stream_kernel(
    X, T, LOSS, G, S, C, n_cols, stride_xr, stride_xc, stride_gr, stride_s, ignore_index,
    BLOCK_N: tl.constexpr, FROM_S: tl.constexpr, DIVIDE: tl.constexpr, WRITE_LOSS: tl.constexpr,
    WRITE_GRAD: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    t = tl.load(T + row)
    x_row = X + row * stride_xr
    cols = tl.arange(0, BLOCK_N)
    # lanes start at the lowest finite float, not -inf, so (m_vec - m_new) is never -inf - -inf
    m_vec = tl.full([BLOCK_N], -3.4028234663852886e38, tl.float32)
    s_vec = tl.zeros([BLOCK_N], tl.float32)
    xt_vec = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, n_cols, BLOCK_N):  # pass 1: online max and rescaled sum per lane, x_t
        c = start + cols
        x = tl.load(x_row + c * stride_xc, mask=c < n_cols, other=float("-inf"), eviction_policy="evict_last")
        x = x.to(tl.float32)
        m_new = tl.maximum(m_vec, x)
        s_vec = s_vec * tl.exp2((m_vec - m_new) * LOG2E) + tl.exp2((x - m_new) * LOG2E)
        m_vec = m_new
        xt_vec += tl.where(c == t, x, 0.0)
    m = tl.max(m_vec, axis=0)
    s = tl.sum(s_vec * tl.exp2((m_vec - m) * LOG2E), axis=0)
    valid = t != ignore_index
    if WRITE_LOSS:
        tl.store(LOSS + row, _row_loss(m, tl.sum(xt_vec, axis=0), tl.log(s), t, n_cols, valid))
    if WRITE_GRAD:
        c_row = tl.where(valid, _scale_of(S, C, row, row >= 0, stride_s, FROM_S, DIVIDE), 0.0)
        f = c_row / tl.where(s == 0.0, 1.0, s)
        n_chunks = tl.cdiv(n_cols, BLOCK_N)
        for k in range(0, n_chunks):  # pass 2, backwards: the chunks read last are still cached
            c = (n_chunks - 1 - k) * BLOCK_N + cols
            x = tl.load(x_row + c * stride_xc, mask=c < n_cols, other=float("-inf"), eviction_policy="evict_first")
            g = tl.exp2((x.to(tl.float32) - m) * LOG2E) * f - tl.where(c == t, c_row, 0.0)
            tl.store(G + row * stride_gr + c, g.to(G.dtype.element_ty), mask=c < n_cols)


# ------------------------------------------------------------------------------------------------
# launch settings and launchers
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    """How one launch covers the rows: ``path`` is 'tile' (``rows`` rows of ``block_n`` per program),
    'split' (chunks of ``block_n``, one program each), 'stream' or 'hybrid' (one program per row) or
    'slices' (``slices`` slices of at most ``block_n`` columns a row, one program each)."""

    path: str
    block_n: int
    rows: int = 1
    num_warps: int = 4
    slices: int = 0


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def plan(n_cols: int, n_rows: int = 1 << 30, elem_bytes: int = 2, hybrid: bool = True) -> Plan:
    """Launch settings by row length (module constants, so tests can force a path). hybrid=False: the
    plan for rows the hybrid or slices path cannot take (see ``hybrid_unusable``, ``slices_unusable``)."""
    block_n = _next_pow2(n_cols)
    if block_n <= TILE_MAX_N:
        if block_n in _TILE:
            rows, warps = _TILE[block_n]
        else:  # short rows: ~4096 elements per program, 16 per thread
            rows = max(1, min(1024, 4096 // block_n))
            warps = max(1, min(8, rows * block_n // 512))
        rows = min(rows, _next_pow2(n_rows))  # (no programs of mostly missing rows)
        warps = max(1, min(warps, rows * block_n // 256))
        return Plan("tile", block_n, rows, warps)
    if LONG_PATH == "hybrid" and hybrid and elem_bytes == 2 and HYBRID_MIN_N < n_cols <= HYBRID_MAX_N:
        return Plan("hybrid", block_n, 1, HYBRID_CE_WARPS)
    if LONG_PATH == "hybrid" and hybrid and elem_bytes == 2 and n_cols > HYBRID_MAX_N:
        p = slices_plan(n_cols, default_slices(n_cols), SLICES_WARPS)
        if p is not None:
            return p
    if LONG_PATH == "split" and -(-n_cols // SPLIT_BLOCK_N) <= MAX_SPLITS:
        return Plan("split", SPLIT_BLOCK_N, 1, SPLIT_WARPS)
    return Plan("stream", STREAM_BLOCK_N, 1, STREAM_WARPS)


def slices_plan(n_cols: int, n_slices: int, num_warps: int) -> Optional[Plan]:
    """The slices plan of rows of n_cols columns in n_slices slices (None where ``slices_reason`` says
    they cannot be cut so); block_n: the slice length."""
    if slices_reason(n_cols, n_slices, num_warps):
        return None
    return Plan("slices", slices_shape(n_cols, n_slices, num_warps)[0], 1, num_warps, n_slices)


def unusable(logits: Tensor, grad: Optional[Tensor], p: Plan) -> Optional[str]:
    """Why the Gluon plan p (hybrid, slices) cannot take these rows (None: it can, or p is no Gluon plan)."""
    if p.path == "hybrid":
        return hybrid_unusable(logits, grad, p.num_warps)
    if p.path == "slices":
        return slices_unusable(logits, grad, p.num_warps, p.slices)
    return None


def launch_ce(logits: Tensor, targets: Tensor, loss_rows: Optional[Tensor], grad: Optional[Tensor],
              ignore_index: int, scale: Optional[Tensor] = None, count: Optional[Tensor] = None,
              p: Optional[Plan] = None) -> None:
    """One cross-entropy pass over logits (n, V) (any strides): loss rows (fp32; None: not written)
    and, when ``grad`` is given ((n, V), column stride 1; may be ``logits`` itself), the gradient
    (softmax - onehot) times ``scale`` (None: 1; one value, or one per row) / max(``count``, 1)
    (None: not divided)."""
    n_rows, n_cols = logits.shape
    if n_rows == 0:
        return
    if grad is not None and grad.stride(1) != 1:
        raise ValueError("launch_ce writes gradients with column stride 1")
    if p is None:
        p = plan(n_cols, n_rows, logits.element_size())
        if unusable(logits, grad, p):
            p = plan(n_cols, n_rows, logits.element_size(), hybrid=False)
    else:  # (a hybrid or slices plan asked for by name: an error, not another path)
        why = unusable(logits, grad, p)
        if why:
            raise ValueError(why)
    dummy = logits if grad is None else grad
    stride_s = scale.stride(0) if (scale is not None and scale.dim() == 1 and scale.numel() > 1) else 0
    flags = dict(FROM_S=scale is not None, DIVIDE=count is not None, WRITE_LOSS=loss_rows is not None,
                 WRITE_GRAD=grad is not None, num_warps=p.num_warps)
    args = (logits, targets, logits if loss_rows is None else loss_rows, dummy,
            logits if scale is None else scale, logits if count is None else count)
    strides = (logits.stride(0), logits.stride(1), dummy.stride(0), stride_s, ignore_index)
    with _device_guard(logits):
        if p.path == "tile":
            _ce_tile_kernel[(fastlaunch.cdiv(n_rows, p.rows),)](
                *args, n_rows, n_cols, *strides, BLOCK_N=p.block_n, ROWS=p.rows, **flags)
        elif p.path == "split":
            splits = -(-n_cols // p.block_n)
            programs = n_rows * splits
            if programs >= 2**31:
                raise ValueError(f"too many row chunks for one launch ({n_rows} rows x {splits} chunks)")
            stat = torch.empty(programs * 2, dtype=torch.float32, device=logits.device)
            meta = dict(BLOCK_N=p.block_n, SPLITS_P2=_next_pow2(splits), **flags)
            if interpreter_enabled():  # programs run one after another: partials first, then outputs
                cnt = torch.zeros(1, dtype=torch.int32, device=logits.device)
                for phase in (1, 2):
                    _ce_split_kernel[(programs,)](*args, cnt, stat, n_cols, splits, *strides, PHASE=phase, **meta)
            else:
                cnt = torch.zeros(n_rows + 1, dtype=torch.int32, device=logits.device)
                _ce_split_kernel[(programs,)](*args, cnt, stat, n_cols, splits, *strides, PHASE=0, **meta)
        elif p.path == "hybrid":
            launch_hybrid(logits, targets, loss_rows, grad, scale, count, stride_s, ignore_index, p.num_warps,
                          {k: v for k, v in flags.items() if k != "num_warps"})
        elif p.path == "slices":
            launch_slices(logits, targets, loss_rows, grad, scale, count, stride_s, ignore_index, p.num_warps,
                          p.slices, {k: v for k, v in flags.items() if k != "num_warps"})
        elif p.path == "stream":
            _ce_stream_kernel[(n_rows,)](*args, n_cols, *strides, BLOCK_N=p.block_n, **flags)
        else:
            raise ValueError(f"unknown cross-entropy path {p.path!r}")


def defers_scale(dtype: torch.dtype) -> bool:
    """Whether the forward leaves 1 / n_valid to the backward (float16: see the module docstring)."""
    return dtype == torch.float16


def forward(logits: Tensor, targets: Tensor, ignore_index: int, reduction: str, compute_grad: bool,
            p: Optional[Plan] = None) -> tuple[Tensor, Tensor, Tensor]:
    """(loss rows, n_valid, gradient or an empty tensor) of logits (N, V)."""
    n_rows, n_cols = logits.shape
    count = count_targets(targets, n_cols, ignore_index)
    loss_rows = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
    grad = torch.empty((n_rows, n_cols), dtype=logits.dtype, device=logits.device) if compute_grad else None
    mean_now = reduction == "mean" and not defers_scale(logits.dtype)
    launch_ce(logits, targets, loss_rows, grad, ignore_index, count=count if mean_now else None, p=p)
    return loss_rows, count, grad if grad is not None else logits.new_empty(0)


def recompute_grad(logits: Tensor, targets: Tensor, count: Tensor, grad_output: Tensor, ignore_index: int,
                   reduction: str, p: Optional[Plan] = None) -> Tensor:
    """The gradient from the logits again, grad_output (and 1 / n_valid) folded in: one read, one write."""
    grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
    go = grad_output.float().reshape(-1)  # (1,) or (N,)
    launch_ce(logits, targets, None, grad, ignore_index, scale=go,
              count=count if reduction == "mean" else None, p=p)
    return grad
