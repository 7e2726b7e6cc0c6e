"""`triton` linear cross-entropy: the loss of ``hidden @ weight.T`` over chunks of tokens, never all logits.

Algorithm. For each chunk of ``chunk_rows`` tokens (forward, when gradients are needed; the chunk loop
is the one every chunking method shares, :mod:`kernels.linear_ce`): logits_c = hidden_c @ weight.T
(cuBLAS, in the compute dtype), then the cross-entropy kernel (:mod:`.launch`) writes the chunk's loss
rows and its gradient (softmax - onehot) / n_valid into logits_c itself (in place: the buffer is ours
and the kernel never re-reads a column it has written), then grad_hidden_c = grad_c @ weight and
grad_weight += grad_c.T @ hidden_c, accumulated in fp32 (``weight_grad_mode``: cuBLAS with an fp32
output accumulating into it, ``addmm``/``baddbmm`` with ``out_dtype`` where this PyTorch takes an fp32
input, else a 16-bit product per chunk added into an fp32 buffer). The backward only multiplies the
saved gradients by grad_output (no work when it is 1). reduction='none' cannot be done that way
(grad_weight sums rows that grad_output weights differently), so there the forward computes the loss
rows only and the backward recomputes each chunk's logits and writes its gradient scaled by grad_output
per row. float16 keeps its gradients unscaled and divides by n_valid in the backward (see the package
docstring); its grad_weight stays fp32 until then. Under torch.compile the same forward runs, and the
backward multiplies out of place: scaled in place, the saved grad_hidden and grad_weight were first
copied by Inductor (it does not reinplace mutations of saved tensors: (N + V) C elements read and
written, 204 MB a step in gpt2s), while a product is fused into their consumers (the final LayerNorm's
backward, the tied embedding's gradient sum).

Autocast: under ``torch.autocast`` the wrapper casts hidden and weight (the fp32 parameter) to the
autocast dtype before the op, as F.linear would, and the gradients flow back through the casts;
outside autocast they must share a dtype. The weight may be tied (the model's embedding): its gradient
is an ordinary gradient that autograd adds to the embedding's.

Bytes and memory (N tokens, C hidden, V vocabulary, b bytes): the GEMMs (6 N C V flops) dominate;
the cross-entropy moves 2 N V b (one read and one write of each chunk, which stays in L2 only for
small chunks); grad_weight's fp32 accumulator is read and written once per chunk inside the GEMM
(V C x 8 bytes per chunk; chunks of >= 1024 rows keep that GEMM compute-bound). Extra memory:
one logits chunk (``LINEAR_CHUNK_BYTES``), grad_hidden and the fp32 accumulator during the chunks, then
the cast gradient once the chunk is freed (``extra_bytes`` bounds it): about 0.47 GiB at N = 16384,
C = 768, V = 50304 in bf16 (5 chunks of 3280 tokens) with an fp32-output GEMM (torch >= 2.8); in
'product' mode (older torch) the 16-bit product buffer is held too and the chunks shrink by its size.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import is_fake

from kernels import linear_ce
from kernels.contract import check_linear_cross_entropy
from kernels.methods.triton.cross_entropy.launch import count_targets, defers_scale, launch_ce, reduce_loss, validate
from kernels.methods.triton.cross_entropy.op import SECOND_BACKWARD, triton_cross_entropy_bwd

#: Bytes of one chunk's logits (:mod:`kernels.linear_ce`: why 350 MiB).
LINEAR_CHUNK_BYTES = linear_ce.CHUNK_BYTES
_WEIGHT_GRAD_MODE: dict = {}


def chunk_rows(n_rows: int, n_cols: int, elem_bytes: int, held_bytes: int = 0) -> int:
    """Tokens per chunk: the fewest equal chunks of at most LINEAR_CHUNK_BYTES of logits, less
    ``held_bytes`` (the product mode's (V, C) buffer, so that its peak stays where the others' is)."""
    budget = max(LINEAR_CHUNK_BYTES - held_bytes, n_cols * elem_bytes)
    return linear_ce.chunk_rows(n_rows, n_cols, elem_bytes, budget)


def extra_bytes(n_rows: int, hidden_dim: int, n_cols: int, elem_bytes: int, mode: str = "addmm_dtype") -> int:
    """An upper bound of what the forward allocates beyond its inputs when both gradients are needed
    (``mode``: ``weight_grad_mode``'s answer): grad_hidden and the fp32 grad_weight throughout, with a
    logits chunk, loss rows and workspaces during the chunks, then the cast grad_weight (the chunk is
    freed first); in 'product' mode the 16-bit (V, C) product buffer is held throughout (the cast
    reuses it) and the chunks are smaller by as much."""
    cast = n_cols * hidden_dim * elem_bytes if elem_bytes != 4 else 0
    product = cast if mode == "product" else 0
    rows = chunk_rows(n_rows, n_cols, elem_bytes, product)
    splits = -(-n_cols // 1024)
    work = rows * splits * 8 + (rows + 1) * 4 + n_rows * 4 + 64
    held = n_rows * hidden_dim * elem_bytes + n_cols * hidden_dim * 4 + product
    return held + max(rows * n_cols * elem_bytes + work, cast - product)


def _accumulate(mode: str, acc: Tensor, a: Tensor, b: Tensor, tmp: Optional[Tensor]) -> None:
    """acc (fp32) += a @ b."""
    if mode == "direct":  # fp32 inputs
        acc.addmm_(a, b)
    elif mode == "addmm_dtype":
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    elif mode == "baddbmm_dtype":
        acc3 = acc.unsqueeze(0)
        torch.baddbmm(acc3, a.unsqueeze(0), b.unsqueeze(0), out_dtype=torch.float32, out=acc3)
    else:  # a 16-bit product added into the fp32 sums
        torch.mm(a, b, out=tmp)
        acc.add_(tmp)


def weight_grad_mode(device: torch.device, dtype: torch.dtype) -> str:
    """How grad_weight accumulates in fp32 here: 'direct' (fp32), 'addmm_dtype' or 'baddbmm_dtype'
    (cuBLAS writes into the fp32 sums: this PyTorch's ``out_dtype`` accepts them), else 'product'.
    Asked once per device and dtype (errors are raised on the host: no sync)."""
    if dtype == torch.float32:
        return "direct"
    key = (str(device), dtype)
    if key not in _WEIGHT_GRAD_MODE:
        mode = "product"
        a = torch.zeros(8, 8, dtype=dtype, device=device)
        acc = torch.zeros(8, 8, dtype=torch.float32, device=device)
        for name in ("addmm_dtype", "baddbmm_dtype"):
            try:
                _accumulate(name, acc, a, a, None)
            except (RuntimeError, NotImplementedError, TypeError):
                continue
            mode = name
            break
        _WEIGHT_GRAD_MODE[key] = mode
    return _WEIGHT_GRAD_MODE[key]


def _chunked(hidden: Tensor, weight: Tensor, targets: Tensor, ignore_index: int, loss_rows: Optional[Tensor],
             scale: Optional[Tensor], count: Optional[Tensor], need_h: bool, need_w: bool) -> tuple[Tensor, Tensor]:
    """Every chunk (:func:`kernels.linear_ce.run_chunks`): logits, loss rows and gradient (in place; times
    ``scale`` per row, / ``count``; see ``launch_ce``), grad_hidden and the fp32 grad_weight.
    Returns (grad_hidden or empty, grad_weight (fp32; the compute dtype where that saves memory) or empty)."""
    v, c = weight.shape
    acc = torch.zeros((v, c), dtype=torch.float32, device=hidden.device) if need_w else None
    mode = weight_grad_mode(hidden.device, hidden.dtype) if need_w else ""
    tmp = torch.empty((v, c), dtype=hidden.dtype, device=hidden.device) if mode == "product" else None
    held = 0 if tmp is None else tmp.numel() * tmp.element_size()
    rows = chunk_rows(hidden.shape[0], v, hidden.element_size(), held)

    def rows_of(logits: Tensor, s: int, e: int, grad: Optional[Tensor]) -> None:
        launch_ce(logits, targets[s:e], None if loss_rows is None else loss_rows[s:e], grad, ignore_index,
                  scale=None if scale is None else scale[s:e], count=count)

    def accumulate(sums: Tensor, a: Tensor, b: Tensor) -> Tensor:
        _accumulate(mode, sums, a, b, tmp)
        return sums

    gh, acc = linear_ce.run_chunks(hidden, weight, rows, rows_of, need_h, need_w, accumulate, acc)
    gh = hidden.new_empty(0) if gh is None else gh  # (two distinct empties: op outputs may not alias)
    if acc is None:
        return gh, hidden.new_empty(0)
    if hidden.dtype == torch.float32 or defers_scale(hidden.dtype):
        return gh, acc  # (fp16: cast in the backward, after the scaling)
    return gh, (tmp.copy_(acc) if tmp is not None else acc.to(hidden.dtype))


def _check_op_input(hidden: Tensor, weight: Tensor, targets: Tensor, ignore_index: int, reduction: str) -> None:
    check_linear_cross_entropy(hidden, weight, targets, ignore_index, reduction)
    if hidden.dim() != 2 or targets.dtype != torch.int64 or hidden.dtype != weight.dtype:
        raise ValueError("the triton linear cross-entropy op takes hidden (N, C) and weight (V, C) of one "
                         "dtype and int64 targets (N,)")
    validate(hidden)


def _weight_grad_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if defers_scale(dtype) else dtype


@torch.library.custom_op("softmax_harness::triton_linear_cross_entropy_fwd", mutates_args=())
def triton_linear_cross_entropy_fwd(hidden: Tensor, weight: Tensor, targets: Tensor, ignore_index: int,
                                    reduction: str, need_hidden_grad: bool,
                                    need_weight_grad: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(loss rows, n_valid, grad_hidden, grad_weight); the gradients (before grad_output) only for
    'mean' and 'sum' and where asked for, else empty."""
    _check_op_input(hidden, weight, targets, ignore_index, reduction)
    count = count_targets(targets, weight.shape[0], ignore_index)
    loss_rows = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
    now = reduction != "none"
    mean_now = reduction == "mean" and not defers_scale(hidden.dtype)
    gh, gw = _chunked(hidden, weight, targets, ignore_index, loss_rows, None, count if mean_now else None,
                      need_hidden_grad and now, need_weight_grad and now)
    return loss_rows, count, gh, gw


@triton_linear_cross_entropy_fwd.register_fake
def _(hidden, weight, targets, ignore_index, reduction, need_hidden_grad, need_weight_grad):
    now = reduction != "none"
    gh = hidden.new_empty(hidden.shape) if need_hidden_grad and now else hidden.new_empty(0)
    gw = (weight.new_empty(weight.shape, dtype=_weight_grad_dtype(weight.dtype)) if need_weight_grad and now
          else hidden.new_empty(0))
    rows = hidden.new_empty(hidden.shape[0], dtype=torch.float32)
    return rows, hidden.new_empty(1, dtype=torch.float32), gh, gw


@torch.library.custom_op("softmax_harness::triton_linear_cross_entropy_bwd", mutates_args=())
def triton_linear_cross_entropy_bwd(hidden: Tensor, weight: Tensor, targets: Tensor, grad_output: Tensor,
                                    ignore_index: int, need_hidden_grad: bool,
                                    need_weight_grad: bool) -> tuple[Tensor, Tensor]:
    """reduction='none': the gradients recomputed chunk by chunk, each row's scaled by grad_output."""
    go = grad_output.float().expand(hidden.shape[0])  # (N,): one factor per row
    gh, gw = _chunked(hidden, weight, targets, ignore_index, None, go, None, need_hidden_grad, need_weight_grad)
    return gh, (gw.to(weight.dtype) if gw.numel() else gw)


@triton_linear_cross_entropy_bwd.register_fake
def _(hidden, weight, targets, grad_output, ignore_index, need_hidden_grad, need_weight_grad):
    gh = hidden.new_empty(hidden.shape) if need_hidden_grad else hidden.new_empty(0)
    return gh, (weight.new_empty(weight.shape) if need_weight_grad else hidden.new_empty(0))


@torch.library.custom_op("softmax_harness::triton_linear_cross_entropy_loss", mutates_args=())
def triton_linear_cross_entropy_loss(hidden: Tensor, weight: Tensor, targets: Tensor, loss_rows: Tensor,
                                     count: Tensor, grad_hidden: Tensor, grad_weight: Tensor, ignore_index: int,
                                     reduction: str) -> Tensor:
    """The loss from the forward's rows; its autograd formula returns the forward's gradients scaled by
    grad_output ('none': recomputed)."""
    return reduce_loss(loss_rows, count, reduction)


@triton_linear_cross_entropy_loss.register_fake
def _(hidden, weight, targets, loss_rows, count, grad_hidden, grad_weight, ignore_index, reduction):
    return loss_rows.new_empty(loss_rows.shape if reduction == "none" else ())


def _setup_loss(ctx, inputs, output) -> None:
    hidden, weight, targets, _, count, gh, gw, ignore_index, reduction = inputs
    ctx.reduction, ctx.ignore_index, ctx.weight_dtype = reduction, ignore_index, weight.dtype
    ctx.divide = reduction == "mean" and defers_scale(hidden.dtype)
    ctx.backward_done = False
    if reduction == "none":
        ctx.save_for_backward(hidden, weight, targets)
    else:
        ctx.save_for_backward(gh, gw, count)


def _traced(grad_output: Tensor) -> bool:
    """True while torch.compile traces this backward. AOTAutograd traces a custom op's autograd formula
    outside Dynamo, with fake tensors; torch.compiler.is_compiling() is True there only from torch 2.13
    (its compile session flag), so the fake gradient says it on torch 2.11 (seen on the GPU image)."""
    return torch.compiler.is_compiling() or is_fake(grad_output)


def _loss_backward(ctx, grad_output: Tensor):
    nones = (None,) * 7
    if ctx.reduction == "none":
        hidden, weight, targets = ctx.saved_tensors
        gh, gw = triton_linear_cross_entropy_bwd(hidden, weight, targets, grad_output, ctx.ignore_index,
                                                 ctx.needs_input_grad[0], ctx.needs_input_grad[1])
        return (gh if ctx.needs_input_grad[0] else None), (gw if ctx.needs_input_grad[1] else None), *nones
    if _traced(grad_output):  # traced: out of place (see the module docstring)
        gh, gw, count = ctx.saved_tensors
        factor = (grad_output / count.clamp(min=1.0)).reshape(()) if ctx.divide else grad_output
        # (products in fp32, as the eager kernels form them, then rounded to each gradient's dtype)
        gh = (gh.float() * factor).to(gh.dtype) if ctx.needs_input_grad[0] else None
        gw = (gw.float() * factor).to(ctx.weight_dtype) if ctx.needs_input_grad[1] else None
        return gh, gw, *nones
    if ctx.backward_done:
        raise RuntimeError(SECOND_BACKWARD)
    ctx.backward_done = True
    gh, gw, count = ctx.saved_tensors
    if ctx.needs_input_grad[0]:
        triton_cross_entropy_bwd(gh, grad_output, count, ctx.divide)
    if ctx.needs_input_grad[1]:
        if gw.dtype != ctx.weight_dtype:  # float16: the fp32 sums, scaled, then cast
            factor = grad_output / count.clamp(min=1.0) if ctx.divide else grad_output
            gw = (gw * factor).to(ctx.weight_dtype)
        else:
            triton_cross_entropy_bwd(gw, grad_output, count, ctx.divide)
    return (gh if ctx.needs_input_grad[0] else None), (gw if ctx.needs_input_grad[1] else None), *nones


triton_linear_cross_entropy_loss.register_autograd(_loss_backward, setup_context=_setup_loss)


def triton_linear_cross_entropy(hidden: Tensor, weight: Tensor, targets: Tensor, ignore_index: int,
                                reduction: str) -> Tensor:
    """The method's op function (hidden (N, C), weight (V, C), int64 targets (N,), already checked)."""
    hidden, weight = linear_ce.compute_pair(hidden, weight, "linear_cross_entropy")  # (the autocast dtype)
    grad_on = torch.is_grad_enabled()
    need_h, need_w = grad_on and hidden.requires_grad, grad_on and weight.requires_grad
    rows, count, gh, gw = triton_linear_cross_entropy_fwd(hidden.detach(), weight.detach(), targets, ignore_index,
                                                          reduction, need_h, need_w)
    return triton_linear_cross_entropy_loss(hidden, weight, targets, rows, count, gh, gw, ignore_index, reduction)
