"""How a chunked linear cross-entropy cuts its tokens: the fewest chunks whose logits fit a budget, all of
one size. Shared by the `triton` and `cuda` methods (any method that chunks over tokens can use it).

Why a budget of 350 MiB: the chunk of logits is the op's main extra memory (the fp32 weight gradient and
grad_hidden come on top of it), and fewer, larger chunks are faster: fewer fp32 read-modify-writes of the
weight gradient and fewer GEMM tails. Measured on the H200 (run M, docs/perf.md) at 16384 x 768 hidden,
50304 x 768 weight, bf16, CUDA-graph replay of forward + backward: 8 chunks 7.27 ms, 7 chunks 7.19, 4
chunks 6.86, 1 chunk 6.73. 350 MiB makes 5 chunks of 3280 tokens there: 0.31 GiB of logits, about 0.47
GiB of extra memory in all, inside the 0.5 GiB the op promises at that size (4 chunks would take 0.55).
(That is with an fp32-output GEMM for the weight gradient, torch >= 2.8; the Triton method's fallback
takes its product buffer off the budget, the CUDA driver's adds an fp32 product per chunk.)
"""

from __future__ import annotations

#: Bytes of logits one chunk may hold.
CHUNK_BYTES = 350 * 2**20


def chunk_rows(n_rows: int, n_cols: int, elem_bytes: int, budget_bytes: int = CHUNK_BYTES) -> int:
    """Tokens per chunk: the fewest chunks whose (rows, n_cols) logits fit ``budget_bytes`` (one row
    when not even one fits), the rows spread evenly over them and rounded up to a multiple of 8 where
    that still fits. At least 1; at most ``n_rows`` when ``n_rows`` >= 1."""
    cap = max(1, budget_bytes // max(1, n_cols * elem_bytes))
    if n_rows <= cap:
        return max(1, n_rows)
    chunks = -(-n_rows // cap)
    rows = -(-n_rows // chunks)
    up8 = -(-rows // 8) * 8
    return up8 if up8 <= cap else rows
