"""The chunked linear cross-entropy's chunk loop, shared by the methods that have one (the `triton` and
`cuda` methods; any method that chunks over tokens can use it): the loss of ``hidden @ weight.T``
against targets without ever holding all the logits.

How the tokens are cut (:func:`chunk_rows`): the fewest chunks whose logits fit a budget, all of one
size. Why a budget of 350 MiB: the chunk of logits is the op's main extra memory (the fp32 weight
gradient and grad_hidden come on top of it), and fewer, larger chunks are faster: fewer fp32
read-modify-writes of the weight gradient and fewer GEMM tails. Measured on the H200 (docs/perf.md) at
16384 x 768 hidden, 50304 x 768 weight, bf16, CUDA-graph replay of forward + backward: 8 chunks 7.27 ms,
7 chunks 7.19, 4 chunks 6.86, 1 chunk 6.73. 350 MiB makes 5 chunks of 3280 tokens there: 0.31 GiB of
logits, about 0.47 GiB of extra memory in all, inside the 0.5 GiB the op promises at that size (4 chunks
would take 0.55). (That is with an fp32-output GEMM for the weight gradient, torch >= 2.8; the Triton
method's fallback takes its product buffer off the budget, the CUDA driver's adds an fp32 product per
chunk.)

The loop (:func:`run_chunks`), autocast off, no host-device sync: per chunk of tokens,
``logits_c = hidden_c @ weight.T`` (cuBLAS, into one buffer every chunk reuses), then the method's row
primitive writes the chunk's losses and, when gradients are wanted, its gradient
``(softmax - onehot) * scale`` in place of ``logits_c`` (each logit read once, never re-read after its
gradient is written), then ``grad_hidden_c = grad_c @ weight`` (hidden's dtype) and ``grad_weight +=
grad_c.T @ hidden_c`` in float32 sums over all chunks. What a method supplies:

``rows(logits_c, start, end, grad_c)``
    its row kernel on tokens [start, end): the losses where it keeps them, and, with ``grad_c`` (then
    ``logits_c`` itself), the gradient over the logits, scaled as the method's reduction wants;
``accumulate(acc, a, b) -> acc``
    ``acc + a @ b`` in float32 (``acc`` None: the first chunk's product makes the sums). The sums are
    the method's: where this PyTorch has no float32-output GEMM on 16-bit inputs, the `triton` method
    adds a 16-bit product (its buffer taken off the chunk budget) and the `cuda` method a float32 one,
    which round differently.

What the forward keeps for the backward, how a mean's 1 / n_valid and grad_output are applied, and the
torch ops around the loop are each method's (``kernels/methods/triton/cross_entropy/linear.py``,
``kernels/methods/cuda/ce_driver.py``). Their inputs' one dtype under autocast or not
(:func:`compute_pair`) is every linear cross-entropy's with kernels of its own, ``cce``'s too.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

#: Bytes of logits one chunk may hold.
CHUNK_BYTES = 350 * 2**20

#: rows(logits_c, start, end, grad_c): a method's row primitive on one chunk (see the module docstring)
ChunkRows = Callable[[torch.Tensor, int, int, Optional[torch.Tensor]], None]
#: accumulate(acc, a, b) -> acc + a @ b in float32 (acc None: a new buffer)
Accumulate = Callable[[Optional[torch.Tensor], torch.Tensor, torch.Tensor], torch.Tensor]


def compute_pair(hidden: torch.Tensor, weight: torch.Tensor, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden and weight in the one dtype a linear cross-entropy's kernels compute in: under ``torch.autocast``
    both cast to its dtype, as ``F.linear`` would (the casts' backward carries the gradients back to the
    inputs' dtypes; the weight is the fp32 parameter); outside it they must share one (TypeError naming
    ``name``, the method's op)."""
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        return hidden.to(dtype), weight.to(dtype)
    if hidden.dtype != weight.dtype:
        raise TypeError(f"{name}: hidden ({hidden.dtype}) and weight ({weight.dtype}) need one dtype outside autocast")
    return hidden, weight


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


def run_chunks(hidden: torch.Tensor, weight: torch.Tensor, rows: int, chunk: ChunkRows, need_gh: bool,
               need_gw: bool, accumulate: Accumulate,
               acc: Optional[torch.Tensor] = None) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """Every chunk of ``rows`` tokens of hidden (N, C) against weight (V, C): the logits, then ``chunk``
    (the method's row primitive, given the logits as the gradient's buffer when ``need_gh`` or
    ``need_gw``), grad_hidden and the weight gradient's float32 sums (added to ``acc`` where given;
    ``accumulate`` is not called without ``need_gw``).
    Returns (grad_hidden (N, C) or None, the float32 sums or ``acc`` as given)."""
    n, v = hidden.shape[0], weight.shape[0]
    write_grad = need_gh or need_gw
    gh = torch.empty(hidden.shape, dtype=hidden.dtype, device=hidden.device) if need_gh else None
    buf = torch.empty((min(rows, n), v), dtype=hidden.dtype, device=hidden.device)
    wt = weight.t()
    with torch.autocast(hidden.device.type, enabled=False):
        for s in range(0, n, rows):
            e = min(n, s + rows)
            logits = buf[: e - s]
            h = hidden[s:e]
            torch.mm(h, wt, out=logits)  # (rows, V)
            chunk(logits, s, e, logits if write_grad else None)
            if gh is not None:
                torch.mm(logits, weight, out=gh[s:e])  # (rows, C)
            if need_gw:
                acc = accumulate(acc, logits.t(), h)  # (V, C)
    return gh, acc  # (the logits' buffer is freed here, before the caller casts the sums)
