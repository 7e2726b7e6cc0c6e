"""`triton`: fused scale + causal mask + softmax in Triton, forward and backward, any row length.

Algorithm. The input is viewed as rows x N (any leading shape; rows may have any stride, columns any
stride; when the leading dims cannot be flattened into one row stride, one copy is made, see below).
For causal scores of shape (..., Tq, Tk), row r is query i = r mod Tq and keeps its first
``min(N, max(0, i + 1 + Tk - Tq))`` keys: only that prefix is loaded; zeros are written after it.

* Tile path (N up to ``MAX_TILE_N``): a program holds ROWS whole rows in registers (several rows per
  program when N is short, so short rows do not underuse the GPU). Forward reads each element once and
  writes it once: max, exp2, sum and the normalisation happen on chip, in fp32.
* Long path (N above ``MAX_TILE_N``, no upper limit): one program per row streams it in chunks twice:
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

import os
from dataclasses import dataclass
from typing import Optional

import torch

from kernels.registry import SoftmaxMethod, register

try:
    import triton
    import triton.language as tl

    _TRITON_ERROR: Optional[str] = None
except Exception as exc:  # pragma: no cover - exercised only where triton is missing
    triton = None
    tl = None
    _TRITON_ERROR = f"triton is not importable ({exc})"

LOG2E = 1.4426950408889634
#: Longest row kept whole in registers; longer rows take the streaming (long) path.
MAX_TILE_N = 32768
#: Chunk length of the long path.
LONG_BLOCK_N = 8192


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
    def _fwd_tile_kernel(
        X, Y, n_rows, n_cols, stride_xr, stride_xc, tq, diag, scale_log2e,
        BLOCK_N: tl.constexpr, ROWS: tl.constexpr, CAUSAL: tl.constexpr, ROUND_MASK: tl.constexpr,
        ZEROS_FIRST: tl.constexpr,
    ):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK_N)
        row_ok = rows < n_rows
        lim = _row_limit(rows, n_cols, tq, diag, CAUSAL)
        keep = row_ok[:, None] & (cols[None, :] < lim[:, None])
        rows64 = rows.to(tl.int64)
        out_ok = row_ok[:, None] & (cols[None, :] < n_cols)
        y_ptrs = Y + rows64[:, None] * n_cols + cols[None, :]
        if CAUSAL and ZEROS_FIRST:  # the masked tail needs no statistics: write its zeros before loading
            tl.store(y_ptrs, tl.zeros([ROWS, BLOCK_N], Y.dtype.element_ty), mask=out_ok & ~keep)
            out_ok = keep
        ld = row_ok[:, None] & (cols[None, :] < _vector_limit(lim, n_cols, CAUSAL, ROUND_MASK)[:, None])
        x = tl.load(X + rows64[:, None] * stride_xr + cols[None, :] * stride_xc, mask=ld, other=0.0)
        x = x.to(tl.float32)
        m = tl.max(tl.where(keep, x * scale_log2e, float("-inf")), axis=1)  # mask after scaling
        m = tl.where(m == float("-inf"), 0.0, m)  # rows with no unmasked key
        # exp2(x * c - m) straight from x (one fma): rounding x * c first would lose precision on
        # large scores, shifting each element differently
        e = tl.where(keep, tl.exp2(x * scale_log2e - m[:, None]), 0.0)
        s = tl.sum(e, axis=1)
        inv = 1.0 / tl.where(s == 0.0, 1.0, s)  # s == 0 only for rows with no unmasked key; NaN stays
        y = e * inv[:, None]
        tl.store(y_ptrs, y.to(Y.dtype.element_ty), mask=out_ok)

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
        m_vec = tl.full([BLOCK_N], float("-inf"), tl.float32)
        s_vec = tl.zeros([BLOCK_N], tl.float32)
        for start in range(0, lim, BLOCK_N):  # pass 1: online max and rescaled sum, per lane
            c = start + cols
            keep = c < lim
            x = tl.load(x_row + c * stride_xc, mask=keep, other=0.0, eviction_policy="evict_last")
            x = x.to(tl.float32)
            m_new = tl.maximum(m_vec, tl.where(keep, x * scale_log2e, float("-inf")))
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
            s_vec = s_vec * tl.exp2(m_vec - m_ref) + tl.where(keep, tl.exp2(x * scale_log2e - m_ref), 0.0)
            m_vec = m_new
        m = tl.max(m_vec, axis=0)
        m = tl.where(m == float("-inf"), 0.0, m)
        s = tl.sum(s_vec * tl.exp2(m_vec - m), axis=0)
        inv = 1.0 / tl.where(s == 0.0, 1.0, s)
        n_chunks = tl.cdiv(n_cols, BLOCK_N)
        for k in range(0, n_chunks):  # pass 2, backwards: the chunks read last are still cached
            c = (n_chunks - 1 - k) * BLOCK_N + cols
            keep = c < lim
            x = tl.load(x_row + c * stride_xc, mask=keep, other=0.0, eviction_policy="evict_first")
            y = tl.where(keep, tl.exp2(x.to(tl.float32) * scale_log2e - m) * inv, 0.0)
            tl.store(y_row + c, y.to(Y.dtype.element_ty), mask=c < n_cols)

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
    zeros_first: bool = False  # causal forward: store the masked tail's zeros before loading the prefix


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


# (rows per program, warps) by BLOCK_N, from `python -m harness.bench triton-sweep` on an H200 (bf16,
# rows x N = 2^27); see docs/perf.md. Keys missing here (N < 128) use 4096-element tiles.
_FWD_TILE = {128: (64, 8), 256: (16, 4), 512: (16, 16), 1024: (8, 16), 2048: (4, 16), 4096: (1, 8),
             8192: (1, 16), 16384: (1, 16), 32768: (1, 32)}
_BWD_TILE = {128: (32, 8), 256: (16, 8), 512: (8, 4), 1024: (4, 16), 2048: (2, 16), 4096: (1, 16),
             8192: (1, 16), 16384: (1, 16), 32768: (1, 32)}


# Causal rows (the attention shape B=8, H=12, T=1024, from the same sweep): (rows per program, warps,
# round_mask). Causal rows do uneven work (row i loads i + 1 keys and writes N): small programs win
# (forward: one row per warp, loads stopping at the exact prefix). Storing the masked tail's zeros
# first (Plan.zeros_first) was swept too and lost.
_CAUSAL_FWD_TILE = {1024: (1, 1, False)}
_CAUSAL_BWD_TILE = {1024: (1, 4, True)}


def plan(n_cols: int, elem_bytes: int, backward: bool = False, causal: bool = False) -> Plan:
    """Launch settings by row length (a table measured on an H200; heuristics outside it)."""
    block_n = _next_pow2(n_cols)
    if block_n > MAX_TILE_N:
        block = min(LONG_BLOCK_N, block_n)
        return Plan(True, block, 1, 16 if block >= 4096 else max(4, block // 256))
    causal_table = _CAUSAL_BWD_TILE if backward else _CAUSAL_FWD_TILE
    if causal and block_n in causal_table:
        rows, warps, round_mask = causal_table[block_n]
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


def launch_fwd(x: torch.Tensor, scale: float, causal: bool, p: Optional[Plan] = None) -> torch.Tensor:
    x2 = _rows_view(x)
    n_rows, n_cols = x2.shape
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    if n_rows == 0:
        return y.view(x.shape)
    p = p or plan(n_cols, x.element_size(), causal=causal)
    tq, diag = _causal_geometry(x.shape, causal)
    with _device_guard(x):
        if p.long:
            _fwd_long_kernel[(n_rows,)](
                x2, y, n_cols, x2.stride(0), x2.stride(1), tq, diag, scale * LOG2E,
                BLOCK_N=p.block_n, CAUSAL=causal, num_warps=p.num_warps,
            )
        else:
            _fwd_tile_kernel[(triton.cdiv(n_rows, p.rows),)](
                x2, y, n_rows, n_cols, x2.stride(0), x2.stride(1), tq, diag, scale * LOG2E,
                BLOCK_N=p.block_n, ROWS=p.rows, CAUSAL=causal, ROUND_MASK=p.round_mask,
                ZEROS_FIRST=p.zeros_first, num_warps=p.num_warps,
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
    tq, diag = _causal_geometry(y.shape, causal)
    with _device_guard(y):
        if p.long:
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
    from kernels.registry import check_scores

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


register(
    SoftmaxMethod(
        name="triton",
        fn=triton_softmax,
        summary="fused Triton kernels: scale + causal mask + softmax, forward and backward, any N",
        unavailable_reason=unavailable_reason,
        validate=validate,
    )
)
