"""The causal forward's memory floor, for ``python -m harness.bench kernels``: see :func:`causal_traffic_ms`."""

from __future__ import annotations

import functools
from typing import Optional

import torch

from harness.bench.timing import bench_graph_ms, bench_ms
from kernels.runtime import availability


def causal_traffic_ms(shape: tuple, dtype: torch.dtype, device: str, rep_ms: int = 100) -> Optional[float]:
    """The memory floor of a fused causal forward, measured: the fastest of a few Triton kernels that
    move exactly its bytes (read each row's unmasked prefix, write the whole row: the prefix copied,
    zeros after) and compute nothing. None where Triton cannot run."""
    if availability.unavailable_reason() or availability.triton is None:
        return None
    kernel = _causal_traffic_kernel()
    x = torch.randn(shape, device=device).to(dtype)
    y = torch.empty_like(x)
    tq, n = shape[-2], shape[-1]
    n_rows = x.numel() // n
    block = 1 << max(0, (n - 1).bit_length())
    want = x.masked_fill(~torch.ones(tq, n, dtype=torch.bool, device=device).tril(n - tq), 0)
    best = None
    for rows, warps in ((1, 1), (1, 2), (1, 4), (2, 2), (4, 4)):
        def run():
            kernel[(-(-n_rows // rows),)](x, y, n_rows, n, tq, n - tq, BLOCK_N=block, ROWS=rows, num_warps=warps)
        run()
        if not torch.equal(y, want):
            raise AssertionError("causal traffic kernel wrote the wrong values")
        ms = bench_graph_ms(run, rep_ms)[0] if device == "cuda" else bench_ms(run, rep_ms)
        best = ms if best is None else min(best, ms)
    return best


@functools.cache
def _causal_traffic_kernel():
    # (lazy: the kernel is defined on a table's first ask, once availability has said Triton runs here)
    import triton
    import triton.language as tl  # (as triton, above)

    @triton.jit
    def causal_traffic(X, Y, n_rows, n_cols, tq, diag, BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK_N)
        lim = tl.minimum(tl.maximum((rows % tq) + diag + 1, 0), n_cols)  # as the fused kernels' _row_limit
        ok = rows < n_rows
        ptr = rows.to(tl.int64)[:, None] * n_cols + cols[None, :]
        x = tl.load(X + ptr, mask=ok[:, None] & (cols[None, :] < lim[:, None]), other=0.0)
        tl.store(Y + ptr, x, mask=ok[:, None] & (cols[None, :] < n_cols))

    return causal_traffic
