"""The ``@triton.jit`` row kernels of the ``triton`` cross-entropy: the tile, split and stream paths, and
their helpers (the gradient's scale, a row's loss). Launched by :func:`.launch.launch_ce`; the algorithm,
the paths and the bytes they move are described in the package docstring
(``kernels/methods/triton/cross_entropy/__init__.py``). The split path's chunk exchange is the softmax's
(``softmax.tile``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernels.methods.triton.softmax.tile import _split_arrive_and_wait, _split_chunk

LOG2E = tl.constexpr(1.4426950408889634)  # a global a @jit function reads must be a constexpr


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
