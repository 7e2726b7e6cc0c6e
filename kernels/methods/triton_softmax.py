"""`triton`: fused scale + causal mask + softmax in Triton, forward and backward, any row length.

Algorithm. The input is viewed as rows x N (any leading shape; rows may have any stride, columns any
stride; when the leading dims cannot be flattened into one row stride, one copy is made, see below).
For causal scores of shape (..., Tq, Tk), row r is query i = r mod Tq and keeps its first
``min(N, max(0, i + 1 + Tk - Tq))`` keys: only that prefix is loaded; zeros are written after it.

* Tile path (N up to ``MAX_TILE_N``): a program holds ROWS whole rows in registers (several rows per
  program when N is short, so short rows do not underuse the GPU). Forward reads each element once and
  writes it once: max, exp2, sum and the normalisation happen on chip, in fp32. For 16-bit rows of
  16K-32K columns (backward; forward where the hybrid path below cannot run) the persistent variant:
  one program per SM loops over rows, and Triton's software
  pipelining prefetches the next rows into shared memory (cp.async) while this one is reduced, so the
  one long row an SM holds does not leave its memory pipe idle between rows. Causal forward rows take
  the fill variant (``_fwd_fill_kernel``): masked columns are read as -inf keys, so the max, the
  exponentials, the sum and the stores need no per-element mask (about 30% fewer instructions; the
  tile kernel still takes scales the fill cannot, 0 and non-finite ones).
* Hybrid path (forward, 16-bit rows of ``HYBRID_MIN_N`` + 1 up to ``RING_MAX_N`` columns, not causal,
  on a GPU): a Gluon kernel (Triton's lower-level dialect: explicit layouts and shared memory), one
  program per row, keeps the row's first ``HYBRID_MIN_N`` columns in registers as packed 32-bit words
  (two elements each, converted to fp32 again in each pass) and copies the rest into shared memory
  with asynchronous copies (cp.async). A 64K-column row then takes 32 KB of registers and 96 KB of
  shared memory, so two programs (two rows) fit an SM and one's reductions overlap the other's loads
  and stores, which one program per SM looping over rows could not do; one read and one write per
  element.
* Ring path (backward, 16-bit rows of ``MAX_TILE_N`` + 1 up to ``RING_MAX_N`` columns, not causal, on a
  GPU): y and dy of such a row do not fit one SM, so a Gluon kernel splits each row over a pair of
  programs (one per SM), each streaming its half of its rows as chunks through a ring of shared-memory
  slots (cp.async), the next rows' chunks in flight while this row is reduced; the pair trades its
  halves' partial sum(dy * y) through one atomic per row. Rows the Gluon paths cannot take (not 16-byte
  aligned; Triton's interpreter) get the plan below them.
* Split path (N above ``SPLIT_ABOVE_N``, at most ``MAX_SPLITS`` chunks): a row is cut into chunks of
  BLOCK_N columns, one program per chunk, each holding its chunk in registers (small programs, several
  per SM, where one program per long row would leave one row in flight per SM). Each program publishes
  its chunk's (max, sum) to a workspace, bumps the row's arrival counter and waits until every chunk of
  the row has arrived, then combines the partials and writes its chunk: still one read and one write
  per element. No deadlock: programs take their chunk from a ticket counter (an atomic), so the chunks
  of a row start in order and a waiting program only waits for programs that are already running (a row
  needs at most ``MAX_SPLITS`` programs resident at once, far fewer than a GPU holds). Triton's CPU
  interpreter runs programs one after another, so there the same kernel runs as two launches (partials
  first, then outputs) instead of waiting.
* Long path (beyond the split path, no upper limit): one program per row streams it in chunks twice:
  an online pass (running max and rescaled sum per lane) and a normalising pass that walks the row
  backwards, so the chunks it reads first are the ones the first pass loaded last and are still in
  L1/L2; the first pass asks the cache to keep the row (evict_last), the second lets it go.
* Backward, one kernel: dx = scale * y * (dy - sum(dy * y)); reads y and dy (only the unmasked prefix)
  and writes dx; only y is saved for backward, never the input.

Bytes moved (tile path): forward 2 x tensor bytes (read x, write y), backward 3 x (read y, dy, write
dx); causal rows read about half. It should run near the device-to-device copy bandwidth. Launch
settings come from tables measured on an H200 (by row length; causal rows have their own) in ``plan``,
with heuristics outside them; never autotuned inside a step.

Registered as the torch ops ``softmax_harness::triton_softmax_fwd`` / ``_bwd`` (``torch.library.custom_op``
with fake implementations and autograd), so ``torch.compile(fullgraph=True)`` traces a model that uses
it without a graph break. Inputs: CUDA tensors (or CPU tensors under ``TRITON_INTERPRET=1``, Triton's
interpreter, for tests), float32/float16/bfloat16, a non-empty last dimension.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Optional

import torch

from kernels.registry import Method, register

try:
    import triton
    import triton.language as tl

    _TRITON_ERROR: Optional[str] = None
except Exception as exc:  # pragma: no cover - exercised only where triton is missing
    triton = None
    tl = None
    _TRITON_ERROR = f"triton is not importable ({exc})"

try:  # Gluon: Triton's lower-level dialect (explicit layouts, shared memory, async copies), for the ring path
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as gl_async

    _GLUON_ERROR: Optional[str] = None
except Exception as exc:  # pragma: no cover - older Triton
    gluon = gl = gl_async = None
    _GLUON_ERROR = f"this Triton has no Gluon ({type(exc).__name__}: {exc})"

LOG2E = 1.4426950408889634
#: Longest row kept whole in registers; longer rows take the streaming (long) path.
MAX_TILE_N = 32768
#: Chunk length of the long path.
LONG_BLOCK_N = 8192
#: Rows longer than this take the split path (a row over several programs; the table below may start
#: it later in one direction), up to MAX_SPLITS chunks.
SPLIT_ABOVE_N = 16384
MAX_SPLITS = 128
#: Ring path (backward, 16-bit rows of MAX_TILE_N + 1 .. RING_MAX_N columns, not causal, on a GPU): warps
#: per program and ring slots (chunks of 8 x 32 x warps elements, 16 KB at 32 warps).
RING_MAX_N = 65536
RING_WARPS = 32
RING_SLOTS = 13
#: Hybrid path (forward, 16-bit rows of HYBRID_MIN_N + 1 .. RING_MAX_N columns, not causal, on a GPU):
#: warps per program and the 16-byte vectors each thread keeps in registers (the rest of the row goes
#: to shared memory: at most 96 KB at 65536 columns, so two programs fit an H200 SM), at most 64
#: registers per thread (two programs of 512 threads per SM).
HYBRID_WARPS = 16
HYBRID_REG_VECS = 4
HYBRID_MIN_N = HYBRID_REG_VECS * 8 * 32 * HYBRID_WARPS  # 16384: the registers' part, always inside the row
HYBRID_MAX_REGS = 64
_RING_MAX_WAIT = 64  # copy groups a thread may have in flight (one wait instruction per count, below)


def interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def unavailable_reason() -> Optional[str]:
    if _TRITON_ERROR:
        return _TRITON_ERROR
    if torch.cuda.is_available() or interpreter_enabled():
        return None
    return (
        "it needs a CUDA GPU and none was found (TRITON_INTERPRET=1, set before triton is imported, "
        "runs Triton's CPU interpreter instead: slow, for tests)"
    )


def validate(x: torch.Tensor) -> None:
    if x.device.type != "cuda" and not interpreter_enabled():
        raise ValueError(
            f"the triton softmax runs on CUDA tensors; got a tensor on {x.device} (TRITON_INTERPRET=1 "
            "runs Triton's CPU interpreter, for tests)"
        )


# ------------------------------------------------------------------------------------------------
# kernels
# ------------------------------------------------------------------------------------------------
if triton is not None:

    @triton.jit
    def _row_limit(rows, n_cols, tq, diag, CAUSAL: tl.constexpr):
        """Number of unmasked keys of each row (query i = row mod Tq keeps keys j <= i + diag)."""
        if CAUSAL:
            return tl.minimum(tl.maximum((rows % tq) + diag + 1, 0), n_cols)
        return tl.zeros_like(rows) + n_cols

    @triton.jit
    def _vector_limit(lim, n_cols, CAUSAL: tl.constexpr, ROUND_MASK: tl.constexpr):
        """With ROUND_MASK, causal prefixes rounded up to a multiple of 8 columns, so that masked loads
        stay whole 16-byte vectors (a ragged mask forces element-wise loads); the exact mask is applied
        after. Without it, the loads stop at the exact prefix."""
        if CAUSAL and ROUND_MASK:
            return tl.minimum(((lim + 7) // 8) * 8, n_cols)
        return lim

    @triton.jit
    def _one_row_limit(row, n_cols, tq, diag, CAUSAL: tl.constexpr):
        if CAUSAL:
            lim = tl.minimum(tl.maximum((row % tq) + diag + 1, 0), n_cols)
        else:
            lim = n_cols
        return lim

    @triton.jit
    def _signed(x, scale_log2e):
        """x * sign(c): x * c = (x * sign(c)) * |c|, so the row's max is taken on the scores themselves
        (exact) and each exponent is (x - max) * |c|: exactly 0 at the max, whatever the magnitude.
        (exp2(fma(x, c, -round(max * c))) shifts every exponent by the max's rounding error, up to
        |max * c| / 2^25: exp2 overflows past |max * c| ~ 2^32.)"""
        return tl.where(scale_log2e < 0, -x, x)

    @triton.jit
    def _rescaled(s, m, ref, a):
        """Sums s taken relative to maxima m, brought to the reference ref (m = -inf: an empty part,
        which adds 0 even when the scale is 0)."""
        return tl.where(m == float("-inf"), 0.0, s * tl.exp2((m - ref) * a))

    @triton.jit
    def _fwd_tile_kernel(
        X, Y, n_rows, n_cols, stride_xr, stride_xc, tq, diag, scale_log2e,
        BLOCK_N: tl.constexpr, ROWS: tl.constexpr, CAUSAL: tl.constexpr, ROUND_MASK: tl.constexpr,
    ):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK_N)
        row_ok = rows < n_rows
        lim = _row_limit(rows, n_cols, tq, diag, CAUSAL)
        keep = row_ok[:, None] & (cols[None, :] < lim[:, None])
        rows64 = rows.to(tl.int64)
        ld = row_ok[:, None] & (cols[None, :] < _vector_limit(lim, n_cols, CAUSAL, ROUND_MASK)[:, None])
        x = tl.load(X + rows64[:, None] * stride_xr + cols[None, :] * stride_xc, mask=ld, other=0.0)
        x = _signed(x.to(tl.float32), scale_log2e)
        a = tl.abs(scale_log2e)
        m = tl.max(tl.where(keep, x, float("-inf")), axis=1)  # mask after the sign
        m = tl.where(m == float("-inf"), 0.0, m)  # rows with no unmasked key
        e = tl.where(keep, tl.exp2((x - m[:, None]) * a), 0.0)
        s = tl.sum(e, axis=1)
        inv = 1.0 / tl.where(s == 0.0, 1.0, s)  # s == 0 only for rows with no unmasked key; NaN stays
        y = e * inv[:, None]
        out_ok = row_ok[:, None] & (cols[None, :] < n_cols)
        tl.store(Y + rows64[:, None] * n_cols + cols[None, :], y.to(Y.dtype.element_ty), mask=out_ok)

    @triton.jit
    def _fwd_fill_kernel(
        X, Y, n_rows, n_cols, stride_xr, stride_xc, tq, diag, c, fill,
        BLOCK_N: tl.constexpr, ROWS: tl.constexpr, CAUSAL: tl.constexpr,
    ):
        """The tile kernel with masked columns read as a fill instead of masked element by element (the
        path of causal forward rows): fill = -inf for c > 0, +inf for c < 0 (c = scale * log2(e),
        finite and nonzero; else the tile kernel), so the row's reference r (the max of x, the min for
        c < 0), the exponentials exp2((x - r) * c) (exactly 0 at the fill), the sum and the stores need
        no mask. Loads are whole vectors up to the prefix rounded up (_vector_limit); the columns
        of the vector that straddles the prefix's end get the fill after the load. Per element
        that leaves a convert, a select, a min/max, the exponential and the normalisation: about 30%
        fewer instructions than the tile kernel, which masks, signs and predicates every element."""
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK_N)[None, :]
        row_ok = rows < n_rows
        lim = tl.where(row_ok, _row_limit(rows, n_cols, tq, diag, CAUSAL), 0)
        rows64 = rows.to(tl.int64)
        ld = cols < _vector_limit(lim, n_cols, CAUSAL, True)[:, None]
        x = tl.load(X + rows64[:, None] * stride_xr + cols * stride_xc, mask=ld, other=fill)
        x = tl.where(cols < lim[:, None], x.to(tl.float32), fill)
        if c > 0:
            r = tl.max(x, axis=1)
        else:
            r = tl.min(x, axis=1)
        r = tl.where(r == fill, 0.0, r)[:, None]  # no key above -inf (after the sign): every exponential is 0
        e = tl.exp2((x - r) * c)
        s = tl.sum(e, axis=1)
        inv = 1.0 / tl.where(s == 0.0, 1.0, s)  # NaN stays NaN
        tl.store(Y + rows64[:, None] * n_cols + cols, (e * inv[:, None]).to(Y.dtype.element_ty),
                 mask=row_ok[:, None] & (cols < n_cols))

    @triton.jit
    def _fwd_persist_kernel(
        X, Y, n_rows, n_cols, stride_xr, stride_xc, tq, diag, scale_log2e,
        BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, STAGES: tl.constexpr,
    ):
        """Persistent tile path, one row at a time: the loop over rows is software-pipelined by Triton
        (STAGES - 1 rows prefetched into shared memory with cp.async while this one is reduced), so an
        SM that holds a single long row still keeps loads in flight."""
        cols = tl.arange(0, BLOCK_N)
        a = tl.abs(scale_log2e)
        for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0), num_stages=STAGES):
            r = tl.cast(row, tl.int64)
            lim = _one_row_limit(r, n_cols, tq, diag, CAUSAL)
            keep = cols < lim
            x = tl.load(X + r * stride_xr + cols * stride_xc, mask=keep, other=0.0).to(tl.float32)
            x = _signed(x, scale_log2e)
            m = tl.max(tl.where(keep, x, float("-inf")), axis=0)
            m = tl.where(m == float("-inf"), 0.0, m)
            e = tl.where(keep, tl.exp2((x - m) * a), 0.0)
            s = tl.sum(e, axis=0)
            inv = 1.0 / tl.where(s == 0.0, 1.0, s)
            tl.store(Y + r * n_cols + cols, (e * inv).to(Y.dtype.element_ty), mask=cols < n_cols)

    @triton.jit
    def _bwd_persist_kernel(
        Y, DY, DX, n_rows, n_cols, stride_dyr, stride_dyc, tq, diag, scale,
        BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, STAGES: tl.constexpr,
    ):
        cols = tl.arange(0, BLOCK_N)
        for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0), num_stages=STAGES):
            r = tl.cast(row, tl.int64)
            lim = _one_row_limit(r, n_cols, tq, diag, CAUSAL)
            keep = cols < lim
            y = tl.load(Y + r * n_cols + cols, mask=keep, other=0.0).to(tl.float32)
            dy = tl.load(DY + r * stride_dyr + cols * stride_dyc, mask=keep, other=0.0).to(tl.float32)
            dot = tl.sum(y * dy, axis=0)
            dx = tl.where(keep, scale * y * (dy - dot), 0.0)
            tl.store(DX + r * n_cols + cols, dx.to(DX.dtype.element_ty), mask=cols < n_cols)

    @triton.jit
    def _fwd_long_kernel(
        X, Y, n_cols, stride_xr, stride_xc, tq, diag, scale_log2e,
        BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        lim = _one_row_limit(row, n_cols, tq, diag, CAUSAL)
        x_row = X + row * stride_xr
        y_row = Y + row * n_cols
        cols = tl.arange(0, BLOCK_N)
        a = tl.abs(scale_log2e)
        # the running max per lane starts at the lowest finite float, not -inf, so that (m_vec - m_new)
        # * |c| stays finite (no -inf * 0 = NaN at scale 0) without a select per element; a row with
        # no finite unmasked score keeps it, and its -inf scores still give exp2(-inf) = 0
        m_vec = tl.full([BLOCK_N], -3.4028234663852886e38, tl.float32)
        s_vec = tl.zeros([BLOCK_N], tl.float32)
        for start in range(0, lim, BLOCK_N):  # pass 1: online max and rescaled sum, per lane
            c = start + cols
            keep = c < lim
            x = tl.load(x_row + c * stride_xc, mask=keep, other=0.0, eviction_policy="evict_last")
            x = _signed(x.to(tl.float32), scale_log2e)
            m_new = tl.maximum(m_vec, tl.where(keep, x, float("-inf")))
            s_vec = s_vec * tl.exp2((m_vec - m_new) * a) + tl.where(keep, tl.exp2((x - m_new) * a), 0.0)
            m_vec = m_new
        m = tl.max(m_vec, axis=0)
        s = tl.sum(s_vec * tl.exp2((m_vec - m) * a), axis=0)
        inv = 1.0 / tl.where(s == 0.0, 1.0, s)
        n_chunks = tl.cdiv(n_cols, BLOCK_N)
        for k in range(0, n_chunks):  # pass 2, backwards: the chunks read last are still cached
            c = (n_chunks - 1 - k) * BLOCK_N + cols
            keep = c < lim
            x = tl.load(x_row + c * stride_xc, mask=keep, other=0.0, eviction_policy="evict_first")
            x = _signed(x.to(tl.float32), scale_log2e)
            y = tl.where(keep, tl.exp2((x - m) * a) * inv, 0.0)
            tl.store(y_row + c, y.to(Y.dtype.element_ty), mask=c < n_cols)

    @triton.jit
    def _split_chunk(CNT, splits, n_cols, tq, diag, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                     PHASE: tl.constexpr):
        """This program's row, chunk, the chunk's columns and which of them are unmasked. PHASE 0 (one
        launch, GPU): the chunk from the ticket counter CNT[0], so chunks start in ticket order (see
        the module docstring); else from the program id."""
        if PHASE == 0:
            vid = tl.atomic_add(CNT, 1)
        else:
            vid = tl.program_id(0)
        row = (vid // splits).to(tl.int64)
        part = vid % splits
        cols = part * BLOCK_N + tl.arange(0, BLOCK_N)
        return row, part, cols, cols < _one_row_limit(row, n_cols, tq, diag, CAUSAL)

    @triton.jit
    def _split_arrive_and_wait(CNT_ROW, splits):
        """Count this program's partial as published (release) and wait until every chunk of the row
        has (acquire). The barrier first: all of this program's partial stores precede the release."""
        tl.debug_barrier()
        tl.atomic_add(CNT_ROW, 1, sem="release")
        while tl.atomic_add(CNT_ROW, 0, sem="acquire") < splits:
            pass

    @triton.jit
    def _fwd_split_kernel(
        X, Y, CNT, STAT, n_cols, splits, stride_xr, stride_xc, tq, diag, scale_log2e,
        BLOCK_N: tl.constexpr, SPLITS_P2: tl.constexpr, CAUSAL: tl.constexpr, PHASE: tl.constexpr,
    ):
        """PHASE 0: whole kernel (GPU). PHASE 1: partials only; PHASE 2: outputs only (interpreter)."""
        row, part, cols, keep = _split_chunk(CNT, splits, n_cols, tq, diag, BLOCK_N, CAUSAL, PHASE)
        x = tl.load(X + row * stride_xr + cols * stride_xc, mask=keep, other=0.0).to(tl.float32)
        x = _signed(x, scale_log2e)
        a = tl.abs(scale_log2e)
        m = tl.max(tl.where(keep, x, float("-inf")), axis=0)
        ref = tl.where(m == float("-inf"), 0.0, m)
        e = tl.where(keep, tl.exp2((x - ref) * a), 0.0)
        s = tl.sum(e, axis=0)
        stat_m = STAT + row * (2 * splits)  # this row's partials: splits maxima, then splits sums
        if PHASE != 2:
            tl.store(stat_m + part, m)
            tl.store(stat_m + splits + part, s)
        if PHASE == 0:
            _split_arrive_and_wait(CNT + 1 + row, splits)
        if PHASE != 1:
            p = tl.arange(0, SPLITS_P2)
            ms = tl.load(stat_m + p, mask=p < splits, other=float("-inf"), cache_modifier=".cg")
            ss = tl.load(stat_m + splits + p, mask=p < splits, other=0.0, cache_modifier=".cg")
            big_m = tl.max(ms, axis=0)
            big_ref = tl.where(big_m == float("-inf"), 0.0, big_m)
            big_s = tl.sum(_rescaled(ss, ms, big_ref, a), axis=0)  # -inf maxima (empty chunks) add 0
            f = tl.exp2((ref - big_ref) * a) / tl.where(big_s == 0.0, 1.0, big_s)  # NaN stays NaN
            tl.store(Y + row * n_cols + cols, (e * f).to(Y.dtype.element_ty), mask=cols < n_cols)

    @triton.jit
    def _bwd_split_kernel(
        Y, DY, DX, CNT, STAT, n_cols, splits, stride_dyr, stride_dyc, tq, diag, scale,
        BLOCK_N: tl.constexpr, SPLITS_P2: tl.constexpr, CAUSAL: tl.constexpr, PHASE: tl.constexpr,
    ):
        row, part, cols, keep = _split_chunk(CNT, splits, n_cols, tq, diag, BLOCK_N, CAUSAL, PHASE)
        y = tl.load(Y + row * n_cols + cols, mask=keep, other=0.0).to(tl.float32)
        dy = tl.load(DY + row * stride_dyr + cols * stride_dyc, mask=keep, other=0.0).to(tl.float32)
        stat = STAT + row * splits
        if PHASE != 2:
            tl.store(stat + part, tl.sum(y * dy, axis=0))
        if PHASE == 0:
            _split_arrive_and_wait(CNT + 1 + row, splits)
        if PHASE != 1:
            p = tl.arange(0, SPLITS_P2)
            dot = tl.sum(tl.load(stat + p, mask=p < splits, other=0.0, cache_modifier=".cg"), axis=0)
            dx = tl.where(keep, scale * y * (dy - dot), 0.0)
            tl.store(DX + row * n_cols + cols, dx.to(DX.dtype.element_ty), mask=cols < n_cols)

    @triton.jit
    def _bwd_tile_kernel(
        Y, DY, DX, n_rows, n_cols, stride_dyr, stride_dyc, tq, diag, scale,
        BLOCK_N: tl.constexpr, ROWS: tl.constexpr, CAUSAL: tl.constexpr, ROUND_MASK: tl.constexpr,
    ):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK_N)
        row_ok = rows < n_rows
        lim = _row_limit(rows, n_cols, tq, diag, CAUSAL)
        keep = row_ok[:, None] & (cols[None, :] < lim[:, None])
        rows64 = rows.to(tl.int64)
        ld = row_ok[:, None] & (cols[None, :] < _vector_limit(lim, n_cols, CAUSAL, ROUND_MASK)[:, None])
        y = tl.load(Y + rows64[:, None] * n_cols + cols[None, :], mask=ld, other=0.0).to(tl.float32)
        dy = tl.load(DY + rows64[:, None] * stride_dyr + cols[None, :] * stride_dyc, mask=ld, other=0.0)
        y = tl.where(keep, y, 0.0)
        dy = tl.where(keep, dy.to(tl.float32), 0.0)
        dot = tl.sum(y * dy, axis=1)
        dx = tl.where(keep, scale * y * (dy - dot[:, None]), 0.0)  # y, dy past lim are not masked-out zeros
        out_ok = row_ok[:, None] & (cols[None, :] < n_cols)
        tl.store(DX + rows64[:, None] * n_cols + cols[None, :], dx.to(DX.dtype.element_ty), mask=out_ok)

    @triton.jit
    def _bwd_long_kernel(
        Y, DY, DX, n_cols, stride_dyr, stride_dyc, tq, diag, scale,
        BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        lim = _one_row_limit(row, n_cols, tq, diag, CAUSAL)
        y_row = Y + row * n_cols
        dy_row = DY + row * stride_dyr
        dx_row = DX + row * n_cols
        cols = tl.arange(0, BLOCK_N)
        acc = tl.zeros([BLOCK_N], tl.float32)
        for start in range(0, lim, BLOCK_N):  # pass 1: sum(dy * y)
            c = start + cols
            keep = c < lim
            y = tl.load(y_row + c, mask=keep, other=0.0, eviction_policy="evict_last")
            dy = tl.load(dy_row + c * stride_dyc, mask=keep, other=0.0, eviction_policy="evict_last")
            acc += y.to(tl.float32) * dy.to(tl.float32)
        dot = tl.sum(acc, axis=0)
        n_chunks = tl.cdiv(n_cols, BLOCK_N)
        for k in range(0, n_chunks):  # pass 2, backwards (cache-friendly, as in the forward)
            c = (n_chunks - 1 - k) * BLOCK_N + cols
            keep = c < lim
            y = tl.load(y_row + c, mask=keep, other=0.0, eviction_policy="evict_first").to(tl.float32)
            dy = tl.load(dy_row + c * stride_dyc, mask=keep, other=0.0, eviction_policy="evict_first")
            dx = tl.where(keep, scale * y * (dy.to(tl.float32) - dot), 0.0)
            tl.store(dx_row + c, dx.to(DX.dtype.element_ty), mask=c < n_cols)


# ------------------------------------------------------------------------------------------------
# Gluon paths: the hybrid forward (a row in registers and shared memory) and the ring backward (rows
# streamed through a ring of shared-memory chunks), long 16-bit rows
# ------------------------------------------------------------------------------------------------
if gluon is not None:
    # cp.async.wait_group takes its count as an immediate: one asm string per count
    _RING_WAIT_ASM = gl.constexpr(tuple(f"cp.async.wait_group {n}; mov.u32 $0, 0;" for n in range(_RING_MAX_WAIT)))

    @gluon.jit
    def _ring_wait(anchor, N: gl.constexpr):
        """Wait until at most N of this thread's copy groups are in flight (no block barrier: each thread
        reads back only the bytes it copied itself)."""
        gl.inline_asm_elementwise(_RING_WAIT_ASM[N], "=r,r", [anchor], dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _ring_copy(dst, X, row, n_rows, n_cols, stride_xr, tv, CHUNK_I: gl.constexpr, CHUNK: gl.constexpr):
        """Start the copy of chunk CHUNK_I of `row` into the ring slot at shared address dst (16 bytes per
        thread, zero-filled past the row end or for rows >= n_rows), as one commit group."""
        left = gl.where(row < n_rows, n_cols - CHUNK_I * CHUNK, 0)
        src = X + gl.minimum(row, n_rows - 1).to(gl.int64) * stride_xr + CHUNK_I * CHUNK + tv
        nbytes = gl.where(tv < left, 16, 0)
        gl.inline_asm_elementwise("cp.async.cg.shared.global [$1], [$2], 16, $3; mov.u32 $0, 0;", "=r,r,l,r",
                                  [dst, src, nbytes], dtype=gl.int32, is_pure=False, pack=1)
        gl_async.commit_group()

    @gluon.jit
    def _ring_start(X, SLOTS: gl.constexpr, VEC: gl.constexpr, T: gl.constexpr, L2: gl.constexpr):
        """The ring (SLOTS chunk slots of T threads x 16 bytes, the kernel's first shared allocation), this
        thread's index in the chunk, its first column (tv), its chunk offsets and its shared address in
        slot 0 (the ring sits at the start of the kernel's shared memory; see _bwd_pair_ring_kernel)."""
        LT: gl.constexpr = gl.SliceLayout(1, L2)
        ring = gl.allocate_shared_memory(X.dtype.element_ty, [SLOTS, T, VEC], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
        tid = gl.arange(0, T, layout=LT)
        tv = tid * VEC
        offs = tv[:, None] + gl.arange(0, VEC, layout=gl.SliceLayout(0, L2))[None, :]
        mine = gl.inline_asm_elementwise("mov.u32 $0, global_smem;", "=r,r", [tid], dtype=gl.int32, is_pure=True,
                                         pack=1) + tid * 16
        return ring, tid, tv, offs, mine

    @gluon.jit
    def _ring_load(ring, pos, SLOTS: gl.constexpr, layout: gl.constexpr):
        """The ring slot of stream position pos (< 2 * SLOTS) and its chunk, fp32."""
        slot = gl.where(pos >= SLOTS, pos - SLOTS, pos)
        return slot, ring.index(slot).load(layout).to(gl.float32)

    # a word of two 16-bit elements as two fp32 values (lo, hi), and two fp32 values back as a word
    # (round to nearest even, hi in the upper half)
    _UNPACK_BF16 = gl.constexpr("shl.b32 $0, $2, 16; and.b32 $1, $2, 0xffff0000;")
    _UNPACK_F16 = gl.constexpr("{ .reg .b16 l, h; mov.b32 {l, h}, $2; cvt.f32.f16 $0, l; cvt.f32.f16 $1, h; }")
    _PACK_BF16 = gl.constexpr("cvt.rn.bf16x2.f32 $0, $2, $1;")
    _PACK_F16 = gl.constexpr("cvt.rn.f16x2.f32 $0, $2, $1;")

    @gluon.jit
    def _unpack(w, BF16: gl.constexpr):
        """(lo, hi) of the words w as fp32. Not pure: each pass converts the words again instead of the
        compiler keeping fp32 copies of the registers' part alive (twice the registers)."""
        if BF16:
            return gl.inline_asm_elementwise(_UNPACK_BF16, "=f,=f,r", [w], dtype=(gl.float32, gl.float32),
                                             is_pure=False, pack=1)
        else:
            return gl.inline_asm_elementwise(_UNPACK_F16, "=f,=f,r", [w], dtype=(gl.float32, gl.float32),
                                             is_pure=False, pack=1)

    @gluon.jit
    def _pack(lo, hi, BF16: gl.constexpr):
        if BF16:
            return gl.inline_asm_elementwise(_PACK_BF16, "=r,f,f", [lo, hi], dtype=gl.int32, is_pure=True, pack=1)
        else:
            return gl.inline_asm_elementwise(_PACK_F16, "=r,f,f", [lo, hi], dtype=gl.int32, is_pure=True, pack=1)

    @gluon.jit
    def _hybrid_keys(buf, i: gl.constexpr, z, offs, n_cols, sgn, S0: gl.constexpr, T: gl.constexpr,
                     VEC: gl.constexpr, NS: gl.constexpr, EVEN: gl.constexpr, L2: gl.constexpr):
        """Shared vector i of every thread as keys x * sign(c) in fp32, -inf past the row end (only the
        last vector, i = NS - 1, can reach past it). z: a zero the compiler cannot see through, different
        in each pass (see _fwd_hybrid_kernel)."""
        key = buf.index(i + z).load(L2).to(gl.float32) * sgn
        if not EVEN and i == NS - 1:
            key = gl.where(offs < n_cols - (S0 + i * T * VEC), key, float("-inf"))
        return key

    @gluon.jit(do_not_specialize=["zero"])  # (never a constant 0 the compiler could fold, whatever it specializes)
    def _fwd_hybrid_kernel(
        X, Y, XW, YW, n_vec, stride_v, scale_log2e, zero,
        NR: gl.constexpr, NS: gl.constexpr, EVEN: gl.constexpr, BF16: gl.constexpr,
    ):
        """Forward for 16-bit rows too long for one program's registers (HYBRID_MIN_N + 1 .. 64K
        columns), one program per row. Thread t keeps vectors t, t + T, ... (NR of them, 16 bytes each)
        in registers as 32-bit words (XW, YW: the same rows viewed as int32) and copies its next NS
        vectors into shared memory with cp.async, issued by inline PTX: each thread reads back only
        what it copied, so no block barrier separates the copies from the reads (Gluon's own async
        copies would put them in). The buffer is the kernel's first shared allocation, at the start of
        its shared memory, where the PTX addresses it (checked by tests/test_triton_softmax.py on the
        compiled kernel). Three passes over the on-chip row: the max of the keys x * sign(c), the sum of
        exp2((key - max) * |c|), the outputs; two block reductions. Each pass reads the shared part
        again, at slot i + k * zero in pass k (zero: a run-time 0): a compiler that saw the same slot
        read three times, and nothing writing it, could keep it in registers across passes instead.
        At most 96 KB of shared memory and 64 registers per thread (launched with maxnreg), so two
        programs share an SM and one's reductions overlap the other's memory traffic. Global memory
        is read and written once per element. Column counts come in VEC-element vectors (n_vec,
        stride_v), so the compiler knows every row is 16-byte aligned."""
        W: gl.constexpr = gl.num_warps()
        T: gl.constexpr = 32 * W
        VEC: gl.constexpr = 8
        S0: gl.constexpr = NR * T * VEC  # first column of the shared part
        L2: gl.constexpr = gl.BlockedLayout([1, VEC], [32, 1], [W, 1], [1, 0])  # thread t: one 16-byte vector
        LT: gl.constexpr = gl.SliceLayout(1, L2)
        L3: gl.constexpr = gl.BlockedLayout([1, NR, 4], [32, 1, 1], [W, 1, 1], [2, 1, 0])  # thread t: NR x 4 words
        LR: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, L3))
        buf, tid, tv, offs, mine = _ring_start(X, NS, VEC, T, L2)  # NS slots: this row's shared part
        row = gl.program_id(0).to(gl.int64)
        n_cols = n_vec * VEC
        x_row = X + row * (stride_v * VEC)
        for i in gl.static_range(NS):  # the shared part: one commit group (zero-filled past the row end)
            c0 = S0 + i * T * VEC + tv
            if EVEN or i < NS - 1:  # (vectors before the last lie inside the row)
                src = x_row + c0
                nbytes = gl.full([T], 16, gl.int32, LT)
            else:
                src = x_row + gl.where(c0 < n_cols, c0, 0)
                nbytes = gl.where(c0 < n_cols, 16, 0)
            gl.inline_asm_elementwise("cp.async.cg.shared.global [$1], [$2], 16, $3; mov.u32 $0, 0;", "=r,r,l,r",
                                      [mine + i * T * 16, src, nbytes], dtype=gl.int32, is_pure=False, pack=1)
        gl_async.commit_group()
        # the registers' part (always inside the row: n_cols > S0), as words
        t3 = gl.arange(0, T, layout=LR)
        i3 = gl.arange(0, NR, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))
        j3 = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))
        offw = t3[:, None, None] * 4 + i3[None, :, None] * (T * 4) + j3[None, None, :]
        w = gl.load(XW + row * (stride_v * 4) + offw)
        a = gl.abs(scale_log2e)
        sgn = gl.where(scale_log2e < 0, -1.0, 1.0)  # keys x * sign(c): see _signed
        lo, hi = _unpack(w, BF16)
        m_t = gl.convert_layout(gl.max(gl.max(gl.maximum(lo * sgn, hi * sgn), axis=2), axis=1), LT)
        _ring_wait(tid, 0)
        for i in gl.static_range(NS):
            key = _hybrid_keys(buf, i, 0, offs, n_cols, sgn, S0, T, VEC, NS, EVEN, L2)
            m_t = gl.maximum(m_t, gl.max(key, axis=1))
        m = gl.max(m_t, axis=0)
        ref = gl.where(m == float("-inf"), 0.0, m)  # no finite key: every exponential below is 0
        lo, hi = _unpack(w, BF16)
        s_t = gl.convert_layout(gl.sum(gl.sum(gl.exp2((lo * sgn - ref) * a) + gl.exp2((hi * sgn - ref) * a), axis=2),
                                       axis=1), LT)
        for i in gl.static_range(NS):
            key = _hybrid_keys(buf, i, zero, offs, n_cols, sgn, S0, T, VEC, NS, EVEN, L2)
            s_t = s_t + gl.sum(gl.exp2((key - ref) * a), axis=1)
        s = gl.sum(s_t, axis=0)
        inv = 1.0 / gl.where(s == 0.0, 1.0, s)  # s == 0: no finite key (all -inf): zeros; NaN stays NaN
        lo, hi = _unpack(w, BF16)
        gl.store(YW + row * (n_vec * 4) + offw,
                 _pack(gl.exp2((lo * sgn - ref) * a) * inv, gl.exp2((hi * sgn - ref) * a) * inv, BF16))
        y_row = Y + row * n_cols + S0
        for i in gl.static_range(NS):
            key = _hybrid_keys(buf, i, 2 * zero, offs, n_cols, sgn, S0, T, VEC, NS, EVEN, L2)
            y = (gl.exp2((key - ref) * a) * inv).to(Y.dtype.element_ty)
            if EVEN or i < NS - 1:
                gl.store(y_row + i * T * VEC + offs, y)
            else:
                gl.store(y_row + i * T * VEC + offs, y, mask=offs < n_cols - (S0 + i * T * VEC))

    @gluon.jit
    def _ring_issue2(dst, Yh, DYh, row0, P, n_rows, rest, n_cols, stride_dy, tv, QN: gl.constexpr, Q: gl.constexpr,
                     CHUNK: gl.constexpr):
        """Copy stream position QN (counted from row0's first copy): item QN // Q (row row0 + that x P),
        copy QN % Q of it: y of chunk (QN % Q) // 2 when even, dy when odd."""
        if (QN % Q) % 2 == 0:
            _ring_copy(dst, Yh, row0 + (QN // Q) * P, n_rows, rest, n_cols, tv, (QN % Q) // 2, CHUNK)
        else:
            _ring_copy(dst, DYh, row0 + (QN // Q) * P, n_rows, rest, stride_dy, tv, (QN % Q) // 2, CHUNK)


    @gluon.jit
    def _bwd_pair_ring_kernel(
        Y, DY, DX, XCH, n_rows, n_vec, stride_v, scale,
        VEC: gl.constexpr, NCH: gl.constexpr, SLOTS: gl.constexpr,
    ):
        """Persistent backward for the ring path's rows: y and dy of a row (256 KB at 64K 16-bit columns)
        do not fit in one SM's shared memory, so a row is split over a pair of programs (2j: the first
        HALF = NCH x CHUNK columns, 2j + 1: the rest), each streaming its half of rows j, j + P, ... (P
        pairs) as y and dy chunks through a ring of SLOTS chunk slots in shared memory (cp.async, as the
        hybrid forward's copies; the next rows' chunks in flight while this row is reduced). Pass 1
        takes the half's sum(y * dy); the pair then trades partials through XCH (int64 per row and half, zeroed before
        the launch: bit 32 set plus the float's bits, one atomic exchange, the partner's read in a loop;
        the value travels in the atomic itself, so relaxed ordering suffices); pass 2 writes dx =
        scale * y * (dy - dot) from shared memory and refills the slots with the next rows' chunks. One
        read of y and dy and one write of dx per element. The partners must be resident at once: the
        grid is at most one program per SM, an even count (as the split path, it assumes the GPU is
        not kept full by other work that waits on this kernel)."""
        W: gl.constexpr = gl.num_warps()
        T: gl.constexpr = 32 * W
        CHUNK: gl.constexpr = VEC * T
        HALF: gl.constexpr = NCH * CHUNK
        Q: gl.constexpr = 2 * NCH  # copies per item (y and dy of each chunk)
        SLOT_BYTES: gl.constexpr = 16 * T
        L2: gl.constexpr = gl.BlockedLayout([1, VEC], [32, 1], [W, 1], [1, 0])
        LT: gl.constexpr = gl.SliceLayout(1, L2)
        n_cols = n_vec * VEC
        stride_dy = stride_v * VEC
        ring, tid, tv, offs, mine = _ring_start(Y, SLOTS, VEC, T, L2)
        pid = gl.program_id(0)
        half = pid % 2
        P = gl.num_programs(0) // 2
        first = pid // 2
        c0 = half * HALF  # this program's first column
        # this program's columns, shifted so that _ring_copy's chunk offsets count from c0
        Yh = Y + c0
        DYh = DY + c0
        rest = n_cols - c0  # columns from c0 to the row end (<= 0: none)
        for q in gl.static_range(SLOTS):  # the first SLOTS copies of this program's stream: y0, dy0, y1, dy1, ...
            _ring_issue2(mine + q * SLOT_BYTES, Yh, DYh, first, P, n_rows, rest, n_cols, stride_dy, tv, q, Q, CHUNK)
        for k in range(0, gl.cdiv(n_rows - first, P)):
            row = first + k * P
            base = (k * Q) % SLOTS
            d_t = gl.zeros([T], gl.float32, LT)
            for i in gl.static_range(NCH):  # pass 1: this half's partial of sum(y * dy)
                _ring_wait(tid, SLOTS - 2 - 2 * i)
                s0, y = _ring_load(ring, base + 2 * i, SLOTS, L2)  # y and dy of chunk i
                s1, dy = _ring_load(ring, base + 2 * i + 1, SLOTS, L2)
                d_t += gl.sum(y * dy, axis=1)
            d = gl.sum(d_t, axis=0)
            # exchange with the partner program (the other half of the row): flag bit 32 plus the float's bits
            mine_x = XCH + row.to(gl.int64) * 2 + half
            word = d.to(gl.int32, bitcast=True).to(gl.int64) & 0xFFFFFFFF
            gl.atomic_xchg(mine_x, word | (1 << 32), sem="relaxed")
            other = XCH + row.to(gl.int64) * 2 + (1 - half)
            v = gl.atomic_add(other, 0, sem="relaxed")
            while (v >> 32) == 0:
                v = gl.atomic_add(other, 0, sem="relaxed")
            dot = d + (v & 0xFFFFFFFF).to(gl.int32).to(gl.float32, bitcast=True)
            dx_row = DX + row.to(gl.int64) * n_cols + c0
            for i in gl.static_range(NCH):  # pass 2: dx, then refill both slots with chunks SLOTS ahead
                s0, y = _ring_load(ring, base + 2 * i, SLOTS, L2)  # y and dy of chunk i
                s1, dy = _ring_load(ring, base + 2 * i + 1, SLOTS, L2)
                dx = (scale * y * (dy - dot)).to(DX.dtype.element_ty)
                gl.store(dx_row + i * CHUNK + offs, dx, mask=offs < rest - i * CHUNK)
                _ring_issue2(mine + s0 * SLOT_BYTES, Yh, DYh, row, P, n_rows, rest, n_cols, stride_dy, tv, 2 * i + SLOTS, Q, CHUNK)
                _ring_issue2(mine + s1 * SLOT_BYTES, Yh, DYh, row, P, n_rows, rest, n_cols, stride_dy, tv, 2 * i + 1 + SLOTS, Q,
                             CHUNK)
        _ring_wait(tid, 0)

# ------------------------------------------------------------------------------------------------
# launch settings
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    """How a launch covers the rows: the tile path (ROWS rows of BLOCK_N per program) or the long path."""

    long: bool
    block_n: int
    rows: int
    num_warps: int
    round_mask: bool = True  # causal rows: load whole 8-column vectors up to the prefix (see _vector_limit)
    fill: bool = False  # forward: masked columns read as a fill (see _fwd_fill_kernel); the causal rows' path
    split: bool = False  # split path: each row in chunks of block_n columns, one program per chunk
    stages: int = 0  # > 0: persistent tile path (rows = 1), rows pipelined `stages` deep (see _fwd_persist_kernel)
    programs_per_sm: int = 1  # persistent path: grid = SMs x this
    ring: bool = False  # ring path (backward; Gluon, GPU only; see _bwd_pair_ring_kernel): a program per SM
    slots: int = 0  # ring path: chunk slots in shared memory (at most; fewer where the GPU has less)
    hybrid: bool = False  # hybrid path (forward; Gluon, GPU only; see _fwd_hybrid_kernel): a program per row


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


# (rows per program, warps) by BLOCK_N, from `python -m harness.bench triton-sweep` on an H200 (bf16,
# rows x N = 2^27); see docs/perf.md. Keys missing here (N < 128) use 4096-element tiles.
_FWD_TILE = {128: (64, 8), 256: (16, 4), 512: (16, 16), 1024: (8, 16), 2048: (4, 16), 4096: (1, 8),
             8192: (1, 16), 16384: (1, 16), 32768: (1, 32)}
_BWD_TILE = {128: (32, 8), 256: (16, 8), 512: (8, 4), 1024: (4, 16), 2048: (2, 16), 4096: (1, 16),
             8192: (1, 16), 16384: (1, 16), 32768: (1, 32)}


# Causal forward rows: the fill kernel's (rows per program, warps) by BLOCK_N, from `python -m harness.bench
# triton-sweep --match fill=True` on an H200 with causal scores of 2^27 elements (bf16, B x 1 x T x T,
# T = BLOCK_N; 16384: 2^28). Causal rows do uneven work (row i loads i + 1 keys and writes N): small
# programs win, one row per program from 1024 columns. Elsewhere: see _causal_fwd_heuristic.
_CAUSAL_FWD_TILE = {128: (16, 2), 256: (8, 1), 512: (4, 1), 1024: (1, 1), 2048: (1, 2), 4096: (1, 4),
                    8192: (1, 4), 16384: (1, 16)}
# Split path: chunk length, warps, and the shortest row that takes it, by direction (forward, backward).
SPLIT_BLOCK_N = 8192
SPLIT_WARPS = {False: 8, True: 8}
_SPLIT_FROM = {False: 65537, True: 32769}
# Persistent tile path (rows pipelined through shared memory), 16-bit rows: BLOCK_N -> (warps, stages),
# by direction (forward: two rows prefetched, 128 KB of shared memory; backward: y and dy of one row).
# Measured on an H200 at N = 32768: forward 0.89 of copy vs 0.77 for the plain tile, backward 0.87 vs
# 0.78; at 16384 the plain tile is as fast, at 65536 a row does not fit twice in shared memory. (On a
# GPU the forward takes the hybrid path instead: 0.935 at 32768; this plan is its fallback.)
_PERSIST = {False: {32768: (32, 3)}, True: {32768: (32, 2)}}
# Causal backward rows (the attention shape B=8, H=12, T=1024, from the sweep): (rows per program, warps,
# round_mask); other lengths use _BWD_TILE.
_CAUSAL_BWD_TILE = {1024: (1, 4, True)}


def _causal_fwd_heuristic(block_n: int) -> tuple[int, int]:
    """(rows per program, warps) of the fill kernel outside its table: 32 elements per thread, one row
    per program from 1024 columns, shorter rows packed one warp's worth (1024 elements) per program."""
    if block_n >= 1024:
        return 1, min(32, block_n // 1024)
    return 1024 // block_n, 1


def plan(n_cols: int, elem_bytes: int, backward: bool = False, causal: bool = False, gluon: bool = True) -> Plan:
    """Launch settings by row length (a table measured on an H200; heuristics outside it). gluon=False:
    the plan for where the Gluon paths (hybrid forward, ring backward) cannot run (see gluon_unusable)."""
    block_n = _next_pow2(n_cols)
    split_from = max(SPLIT_ABOVE_N + 1, _SPLIT_FROM[backward])
    if gluon and not causal and elem_bytes == 2:
        if not backward and HYBRID_MIN_N < n_cols <= RING_MAX_N:
            return Plan(False, block_n, 1, HYBRID_WARPS, hybrid=True)
        if backward and MAX_TILE_N < n_cols <= RING_MAX_N:
            return Plan(False, block_n, 1, RING_WARPS, ring=True, slots=RING_SLOTS)
    if n_cols >= split_from and -(-n_cols // SPLIT_BLOCK_N) <= MAX_SPLITS:
        return Plan(False, SPLIT_BLOCK_N, 1, SPLIT_WARPS[backward], split=True)
    if not causal and elem_bytes == 2 and block_n in _PERSIST[backward]:
        warps, stages = _PERSIST[backward][block_n]
        return Plan(False, block_n, 1, warps, stages=stages)
    if block_n > MAX_TILE_N:
        block = min(LONG_BLOCK_N, block_n)
        return Plan(True, block, 1, 16 if block >= 4096 else max(4, block // 256))
    if causal and not backward:
        rows, warps = _CAUSAL_FWD_TILE.get(block_n) or _causal_fwd_heuristic(block_n)
        return Plan(False, block_n, rows, warps, fill=True)
    if causal and block_n in _CAUSAL_BWD_TILE:
        rows, warps, round_mask = _CAUSAL_BWD_TILE[block_n]
        return Plan(False, block_n, rows, warps, round_mask)
    table = _BWD_TILE if backward else _FWD_TILE
    if block_n in table:
        rows, warps = table[block_n]
        return Plan(False, block_n, rows, warps)
    rows = max(1, 4096 // block_n)  # short rows: several per program, ~16 elements per thread
    return Plan(False, block_n, rows, max(1, min(8, rows * block_n // (32 * 16))))


def _rows_view(x: torch.Tensor) -> torch.Tensor:
    """x as a (rows, N) view when the leading dims flatten to one row stride; else one copy."""
    n = x.shape[-1]
    try:
        return x.view(-1, n)
    except RuntimeError:
        return x.reshape(-1, n)  # leading dims not flattenable (e.g. transposed): one copy


def _causal_geometry(shape: torch.Size, causal: bool) -> tuple[int, int]:
    if not causal:
        return 1, 0
    tq, tk = shape[-2], shape[-1]
    return tq, tk - tq


def _device_guard(x: torch.Tensor):
    return torch.cuda.device(x.device) if x.is_cuda else _Null()


class _Null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


_DEVICE_PROPS: dict = {}


def _device_props(device: torch.device):
    """The GPU's properties (SM count, shared memory per block), asked once per device."""
    if device not in _DEVICE_PROPS:
        _DEVICE_PROPS[device] = torch.cuda.get_device_properties(device)
    return _DEVICE_PROPS[device]


def _smem_per_block(device: torch.device) -> int:
    """Shared memory one program may opt in to on this GPU (48 KB where the property is missing)."""
    return getattr(_device_props(device), "shared_memory_per_block_optin", 0) or 48 * 1024


def _persistent_grid(n_rows: int, device: torch.device, p: Plan) -> int:
    if device.type != "cuda":
        return min(n_rows, 4)  # the interpreter: a few programs, each looping over rows
    return max(1, min(n_rows, _device_props(device).multi_processor_count * p.programs_per_sm))


def fill_scale_ok(c: float) -> bool:
    """Whether the fill kernel takes c = scale * log2(e): finite and nonzero (at c = 0 or +-inf the fill's
    (fill - r) * c would be NaN, and so would (x - r) * c at the max for infinite c)."""
    return math.isfinite(c) and c != 0.0


def _launch_split(kernel, p: Plan, n_rows: int, n_cols: int, device, tensors: tuple, args: tuple,
                  causal: bool) -> None:
    """One program per chunk; a zeroed ticket + per-row arrival counter and a partials workspace
    (2 floats per chunk forward, 1 backward; allocated per call: the counters must start at zero)."""
    splits = -(-n_cols // p.block_n)
    programs = n_rows * splits
    if programs >= 2**31:
        raise ValueError(f"too many row chunks for one launch ({n_rows} rows x {splits} chunks)")
    stat = torch.empty(n_rows * splits * 2, dtype=torch.float32, device=device)
    meta = dict(BLOCK_N=p.block_n, SPLITS_P2=_next_pow2(splits), CAUSAL=causal, num_warps=p.num_warps)
    if interpreter_enabled():  # programs run one after another: partials first, then outputs
        cnt = torch.zeros(1, dtype=torch.int32, device=device)
        for phase in (1, 2):
            kernel[(programs,)](*tensors, cnt, stat, n_cols, splits, *args, PHASE=phase, **meta)
    else:
        cnt = torch.zeros(n_rows + 1, dtype=torch.int32, device=device)
        kernel[(programs,)](*tensors, cnt, stat, n_cols, splits, *args, PHASE=0, **meta)


def _ring_shape(y2: torch.Tensor, p: Plan) -> tuple[int, int, int]:
    """(elements per 16-byte vector, chunk length, chunks per program and row) of the ring path: chunks
    of half a row, each a y and a dy copy."""
    vec = 16 // y2.element_size()
    chunk = vec * 32 * p.num_warps
    cols = -(-y2.shape[1] // 2)  # columns per program and row
    return vec, chunk, -(-cols // chunk)


def ring_slots(device: torch.device, p: Plan) -> int:
    """Ring slots for this GPU: the plan's, or as many as its shared memory per block holds (1 KB kept
    for the reductions' scratch)."""
    return min(p.slots, _RING_MAX_WAIT, (_smem_per_block(device) - 1024) // (16 * 32 * p.num_warps))


def _hybrid_shape(n_cols: int, p: Plan) -> tuple[int, int, bool]:
    """(16-byte vectors per thread in registers, in shared memory, whether they cover the row exactly)
    of the hybrid path for 16-bit rows of n_cols columns; shared memory <= 0: the registers alone hold
    the row, which the hybrid kernel does not take."""
    threads, n_vec = 32 * p.num_warps, n_cols // 8
    nr = HYBRID_REG_VECS
    ns = -(-(n_vec - nr * threads) // threads)
    return nr, ns, n_vec == (nr + ns) * threads


def gluon_unusable(x2: torch.Tensor, causal: bool, p: Plan, dy2: Optional[torch.Tensor] = None) -> Optional[str]:
    """Why the plan's Gluon path (hybrid forward; ring backward, with dy2) cannot take these rows (None:
    it can): they are Gluon kernels (GPU only, not in Triton's interpreter), copy 16-byte vectors (rows
    and their stride must be 16-byte aligned) and keep part of a row (hybrid) or half a row of y and of
    dy (ring) in shared memory."""
    name = "the ring path" if p.ring else "the hybrid path"
    if causal:
        return f"{name} does not take causal rows"
    if _GLUON_ERROR:
        return _GLUON_ERROR
    if not x2.is_cuda:
        return f"{name} runs on a GPU only (not in Triton's interpreter)"
    if torch.cuda.get_device_capability(x2.device) < (8, 0):
        return f"{name} needs cp.async (compute capability 8.0 or newer)"
    vec = 16 // x2.element_size()
    for t in (x2,) if dy2 is None else (x2, dy2):
        if t.stride(1) != 1 or t.shape[1] % vec or t.stride(0) % vec or t.data_ptr() % 16:
            return f"{name} needs 16-byte aligned rows (column count and row stride multiples of 16 bytes)"
    if x2.element_size() != 2:
        return f"{name} takes 16-bit rows"
    if p.ring:
        slots = 2 * _ring_shape(x2, p)[2]
        if slots > ring_slots(x2.device, p):
            return f"a row of {x2.shape[1]} columns does not fit in this GPU's shared memory as {slots} ring slots"
    else:
        ns = _hybrid_shape(x2.shape[1], p)[1]
        if ns <= 0:
            return "the hybrid path takes rows longer than the part its registers hold"
        smem, need = _smem_per_block(x2.device), ns * 16 * 32 * p.num_warps
        if need > smem - 1024:
            return f"the hybrid path's {need // 1024} KB of shared memory per row exceed this GPU's {smem // 1024} KB"
    return None


def _launch_hybrid(x2: torch.Tensor, y: torch.Tensor, scale: float, p: Plan) -> None:
    n_rows, n_cols = x2.shape
    nr, ns, even = _hybrid_shape(n_cols, p)
    _fwd_hybrid_kernel[(n_rows,)](
        x2, y, x2.view(torch.int32), y.view(torch.int32), n_cols // 8, x2.stride(0) // 8, scale * LOG2E, 0,
        NR=nr, NS=ns, EVEN=even, BF16=x2.dtype == torch.bfloat16, num_warps=p.num_warps, maxnreg=HYBRID_MAX_REGS,
    )


def ring_pairs(n_rows: int, device: torch.device, p: Plan) -> int:
    """Program pairs of the ring backward: one per row, at most one program per SM (partners must be
    resident at once)."""
    return max(1, _persistent_grid(2 * n_rows, device, p) // 2)


def _launch_ring_bwd(y2: torch.Tensor, dy2: torch.Tensor, dx: torch.Tensor, scale: float, p: Plan) -> None:
    n_rows, n_cols = y2.shape
    vec, _, nch = _ring_shape(y2, p)
    pairs = ring_pairs(n_rows, y2.device, p)
    xch = torch.zeros(2 * n_rows, dtype=torch.int64, device=y2.device)  # the pairs' partials (zeroed per call)
    _bwd_pair_ring_kernel[(2 * pairs,)](
        y2, dy2, dx, xch, n_rows, n_cols // vec, dy2.stride(0) // vec, scale,
        VEC=vec, NCH=nch, SLOTS=ring_slots(y2.device, p), num_warps=p.num_warps,
    )


def launch_fwd(x: torch.Tensor, scale: float, causal: bool, p: Optional[Plan] = None) -> torch.Tensor:
    x2 = _rows_view(x)
    n_rows, n_cols = x2.shape
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    if n_rows == 0:
        return y.view(x.shape)
    p = p or plan(n_cols, x.element_size(), causal=causal)
    if p.ring:
        raise ValueError("the ring path is a backward path (the forward's Gluon path is the hybrid one)")
    if p.hybrid and gluon_unusable(x2, causal, p):  # (unaligned rows, the interpreter): the next-best plan
        p = plan(n_cols, x.element_size(), causal=causal, gluon=False)
    tq, diag = _causal_geometry(x.shape, causal)
    with _device_guard(x):
        if p.hybrid:
            _launch_hybrid(x2, y, scale, p)
        elif p.split:
            _launch_split(_fwd_split_kernel, p, n_rows, n_cols, x.device,
                          (x2, y), (x2.stride(0), x2.stride(1), tq, diag, scale * LOG2E), causal)
        elif p.stages:
            _fwd_persist_kernel[(_persistent_grid(n_rows, x.device, p),)](
                x2, y, n_rows, n_cols, x2.stride(0), x2.stride(1), tq, diag, scale * LOG2E,
                BLOCK_N=p.block_n, CAUSAL=causal, STAGES=p.stages, num_warps=p.num_warps,
            )
        elif p.long:
            _fwd_long_kernel[(n_rows,)](
                x2, y, n_cols, x2.stride(0), x2.stride(1), tq, diag, scale * LOG2E,
                BLOCK_N=p.block_n, CAUSAL=causal, num_warps=p.num_warps,
            )
        elif p.fill and fill_scale_ok(c := scale * LOG2E):
            _fwd_fill_kernel[(triton.cdiv(n_rows, p.rows),)](
                x2, y, n_rows, n_cols, x2.stride(0), x2.stride(1), tq, diag, c, -math.inf if c > 0 else math.inf,
                BLOCK_N=p.block_n, ROWS=p.rows, CAUSAL=causal, num_warps=p.num_warps,
            )
        else:  # (a fill plan whose scale the fill cannot take: the same tile, masked element by element)
            _fwd_tile_kernel[(triton.cdiv(n_rows, p.rows),)](
                x2, y, n_rows, n_cols, x2.stride(0), x2.stride(1), tq, diag, scale * LOG2E,
                BLOCK_N=p.block_n, ROWS=p.rows, CAUSAL=causal, ROUND_MASK=p.round_mask, num_warps=p.num_warps,
            )
    return y.view(x.shape)


def launch_bwd(
    y: torch.Tensor, dy: torch.Tensor, scale: float, causal: bool, p: Optional[Plan] = None
) -> torch.Tensor:
    y2 = y.view(-1, y.shape[-1])  # y is our own contiguous output
    dy2 = _rows_view(dy)
    n_rows, n_cols = y2.shape
    dx = torch.empty((n_rows, n_cols), dtype=y.dtype, device=y.device)
    if n_rows == 0:
        return dx.view(y.shape)
    p = p or plan(n_cols, y.element_size(), backward=True, causal=causal)
    if p.hybrid or p.fill:
        raise ValueError(f"the {'hybrid' if p.hybrid else 'fill'} path is a forward path")
    if p.ring and gluon_unusable(y2, causal, p, dy2):  # (unaligned rows, the interpreter): the next-best plan
        p = plan(n_cols, y.element_size(), backward=True, causal=causal, gluon=False)
    tq, diag = _causal_geometry(y.shape, causal)
    with _device_guard(y):
        if p.ring:
            _launch_ring_bwd(y2, dy2, dx, scale, p)
        elif p.split:
            _launch_split(_bwd_split_kernel, p, n_rows, n_cols, y.device,
                          (y2, dy2, dx), (dy2.stride(0), dy2.stride(1), tq, diag, scale), causal)
        elif p.stages:
            _bwd_persist_kernel[(_persistent_grid(n_rows, y.device, p),)](
                y2, dy2, dx, n_rows, n_cols, dy2.stride(0), dy2.stride(1), tq, diag, scale,
                BLOCK_N=p.block_n, CAUSAL=causal, STAGES=p.stages, num_warps=p.num_warps,
            )
        elif p.long:
            _bwd_long_kernel[(n_rows,)](
                y2, dy2, dx, n_cols, dy2.stride(0), dy2.stride(1), tq, diag, scale,
                BLOCK_N=p.block_n, CAUSAL=causal, num_warps=p.num_warps,
            )
        else:
            _bwd_tile_kernel[(triton.cdiv(n_rows, p.rows),)](
                y2, dy2, dx, n_rows, n_cols, dy2.stride(0), dy2.stride(1), tq, diag, scale,
                BLOCK_N=p.block_n, ROWS=p.rows, CAUSAL=causal, ROUND_MASK=p.round_mask, num_warps=p.num_warps,
            )
    return dx.view(y.shape)


# ------------------------------------------------------------------------------------------------
# torch ops (custom_op + fake + autograd) and registration
# ------------------------------------------------------------------------------------------------
def _check_op_input(x: torch.Tensor, causal: bool) -> None:
    from kernels.contract import check_scores

    check_scores(x, causal)
    validate(x)


@torch.library.custom_op("softmax_harness::triton_softmax_fwd", mutates_args=())
def triton_softmax_fwd(x: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    _check_op_input(x, causal)
    return launch_fwd(x, scale, causal)


@triton_softmax_fwd.register_fake
def _(x: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@torch.library.custom_op("softmax_harness::triton_softmax_bwd", mutates_args=())
def triton_softmax_bwd(y: torch.Tensor, dy: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    return launch_bwd(y, dy, scale, causal)


@triton_softmax_bwd.register_fake
def _(y: torch.Tensor, dy: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    return torch.empty(y.shape, dtype=y.dtype, device=y.device)


def _setup_context(ctx, inputs, output) -> None:
    _, scale, causal = inputs
    ctx.save_for_backward(output)  # only y is saved, never the input
    ctx.scale, ctx.causal = scale, causal


def _backward(ctx, dy: torch.Tensor):
    (y,) = ctx.saved_tensors
    return triton_softmax_bwd(y, dy, ctx.scale, ctx.causal), None, None


triton_softmax_fwd.register_autograd(_backward, setup_context=_setup_context)


def triton_softmax(scores: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    return triton_softmax_fwd(scores, scale, causal)


if triton is not None:
    from kernels.methods.triton.cross_entropy import triton_cross_entropy
    from kernels.methods.triton.linear_cross_entropy import triton_linear_cross_entropy
else:  # pragma: no cover - the method is unavailable without triton
    triton_cross_entropy = triton_linear_cross_entropy = None

register(
    Method(
        name="triton",
        softmax=triton_softmax,
        cross_entropy=triton_cross_entropy,
        linear_cross_entropy=triton_linear_cross_entropy,
        summary="fused Triton kernels: scale + causal mask + softmax, forward and backward, any N; "
                "cross-entropy (and chunked linear cross-entropy) with the gradient in the forward",
        unavailable_reason=unavailable_reason,
        validate=validate,
    )
)
