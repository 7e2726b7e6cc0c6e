"""The ops' contracts (the same for every method) and the checks a bound op runs before the method.

``softmax(scores, scale, causal)``
    softmax over the last dimension of ``scale * scores``; any number of leading dimensions; with
    ``causal=True`` and scores of shape (..., Tq, Tk), key j is masked for query i when
    ``j > i + (Tk - Tq)``; masked entries get probability exactly 0 and gradient exactly 0; a row
    with no unmasked key (possible when Tq > Tk) gives all zeros and zero gradient, never NaN; output
    in the input dtype (float32, float16, bfloat16), accumulation in float32; differentiable.

``attention(q, k, v, scale, causal, dropout_p)``
    q (B, H, Tq, d), k (B, H, Tk, d), v (B, H, Tk, dv) -> (B, H, Tq, dv) in q's dtype:
    softmax(scale * q k^T) v, the causal mask and fully masked rows as in the softmax (a query with
    no key gets zeros and zero gradient); scale None means 1/sqrt(d); dropout on the probabilities
    with probability ``dropout_p`` (a method that cannot drop out inside its kernel refuses
    ``dropout_p > 0`` with a clear error); any strides.

``attention_qkv(qkv, n_head, scale, causal, dropout_p)``
    the attention of one projection's output: qkv (B, T, 3 C) holds q, k and v side by side on its last
    dimension (``nn.Linear(C, 3 C)``'s layout), each C = n_head * d split into heads ->
    (B, n_head, T, d), equal to ``attention(q, k, v, ...)`` of
    ``qkv[..., i * C:(i + 1) * C].view(B, T, n_head, d).transpose(1, 2)``; scale None means
    1/sqrt(d). A method that implements it natively returns the gradient of qkv as one tensor (the
    composed op's backward concatenates the three gradients: a copy of all of them).

``cross_entropy(logits, targets, ignore_index, reduction)``
    logits (..., V) in float32/float16/bfloat16, targets (...) int64 (int32 accepted); the loss
    -log softmax(logits)[target] per target, float32, accumulated in float32; ``reduction`` "mean"
    (over the targets that are not ``ignore_index``), "sum", or "none" (one loss per target, 0 where
    ignored); every target ignored gives loss 0 and a zero gradient, never NaN; the gradient in the
    logits' dtype; any strides; no cap on V. A target outside [0, V) that is not ``ignore_index``
    is an error (checked here for CPU tensors; on a GPU by the method, on the device).

``linear_cross_entropy(hidden, weight, targets, ignore_index, reduction)``
    the cross-entropy of ``hidden @ weight.T`` (hidden (..., C), weight (V, C)) with gradients for
    hidden and weight; a method that implements it natively never holds all the logits at once.

The op functions a method registers receive their inputs already checked and flattened as noted in
:class:`kernels.registry.Method`; the bound functions (:func:`checked`) do the checking.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch

from layouts import split_qkv  # noqa: F401  (the contract's split, the model's too: stated once there)

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
TARGET_DTYPES = (torch.int64, torch.int32)
REDUCTIONS = ("mean", "sum", "none")


def _dtype_names(dtypes) -> str:
    return ", ".join(str(d).replace("torch.", "") for d in dtypes)


def _float_tensor(t, what: str, op: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op} expects a torch.Tensor for {what}, got {type(t).__name__}")
    if t.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{op} got {what} of dtype {t.dtype}; supported dtypes: {_dtype_names(SUPPORTED_DTYPES)}")


def check_scores(scores: torch.Tensor, causal: bool) -> None:
    """The softmax's input checks (dtype, shape)."""
    _float_tensor(scores, "scores", "softmax")
    if scores.dim() == 0:
        raise ValueError("softmax needs at least one dimension (got a 0-d tensor)")
    if scores.shape[-1] == 0:
        raise ValueError(f"softmax over an empty last dimension is undefined (scores shape {tuple(scores.shape)})")
    if causal and scores.dim() < 2:
        raise ValueError(f"causal softmax needs scores of shape (..., Tq, Tk); got shape {tuple(scores.shape)}")


def check_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        _float_tensor(t, name, "attention")
        if t.dim() != 4:
            raise ValueError(f"attention takes q, k, v of shape (B, H, T, d); got {name} of shape {tuple(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"attention needs q, k, v of one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"attention needs q, k, v on one device; got {q.device}, {k.device}, {v.device}")
    (B, H, _, d), (kb, kh, tk, kd), (vb, vh, vt, _) = q.shape, k.shape, v.shape  # (unpacked: no Size slices)
    if not (B == kb == vb and H == kh == vh and tk == vt and d == kd):
        raise ValueError(
            f"attention shapes do not match: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} "
            "(q (B, H, Tq, d), k (B, H, Tk, d), v (B, H, Tk, dv))"
        )
    if q.shape[-1] == 0:
        raise ValueError(f"attention needs a head dimension d >= 1; got q of shape {tuple(q.shape)}")
    if not 0.0 <= float(dropout_p) < 1.0:
        raise ValueError(f"attention dropout_p={dropout_p!r} is not accepted: a float in [0, 1)")


def check_attention_qkv(qkv: torch.Tensor, n_head: int, dropout_p: float) -> None:
    _float_tensor(qkv, "qkv", "attention_qkv")
    if isinstance(n_head, bool) or not isinstance(n_head, int) or n_head < 1:
        raise ValueError(f"attention_qkv takes n_head, an int >= 1; got {n_head!r}")
    if qkv.dim() != 3 or qkv.shape[-1] == 0 or qkv.shape[-1] % (3 * n_head):
        raise ValueError(
            f"attention_qkv takes qkv of shape (B, T, 3 * n_head * d) with d >= 1; got {tuple(qkv.shape)} "
            f"with n_head={n_head} (the last dimension must be a positive multiple of {3 * n_head})"
        )
    if not 0.0 <= float(dropout_p) < 1.0:
        raise ValueError(f"attention_qkv dropout_p={dropout_p!r} is not accepted: a float in [0, 1)")


def _check_targets(op: str, targets, lead_shape: tuple, n_cols: int, device: torch.device, ignore_index: int,
                   reduction: str, logits_name: str) -> None:
    """The cross-entropies' target checks: integer targets of the logits' leading shape on their device,
    the reduction, and (CPU tensors) every target in [0, V) or ignore_index."""
    if not isinstance(targets, torch.Tensor) or targets.dtype not in TARGET_DTYPES:
        got = targets.dtype if isinstance(targets, torch.Tensor) else type(targets).__name__
        raise TypeError(f"{op} takes integer class targets (int64 or int32); got {got}")
    if tuple(targets.shape) != lead_shape:
        raise ValueError(
            f"{op}: targets of shape {tuple(targets.shape)} do not match {logits_name} of shape "
            f"{(*lead_shape, n_cols)} (targets must have the logits' shape without the last dimension)"
        )
    if device != targets.device:
        raise ValueError(f"{op} needs its inputs and targets on one device; got {device}, {targets.device}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"{op} reduction={reduction!r} is not accepted: one of {', '.join(REDUCTIONS)}")
    if targets.device.type != "cpu" or not targets.numel():  # on a GPU: checked on the device (no sync here)
        return
    bad = ((targets < 0) | (targets >= n_cols)) & (targets != ignore_index)
    msg = f"{op}: a target is outside [0, {n_cols}) and is not ignore_index ({ignore_index})"
    if torch.compiler.is_compiling():  # traced: a check in the graph (a host read would break it)
        torch._assert_async(~bad.any(), msg)
    elif bool(bad.any()):
        first = int(targets[bad].flatten()[0])
        raise ValueError(f"{op}: target {first} is outside [0, {n_cols}) and is not ignore_index ({ignore_index})")


def check_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int, reduction: str) -> None:
    _float_tensor(logits, "logits", "cross_entropy")
    if logits.dim() == 0 or logits.shape[-1] == 0:
        raise ValueError(f"cross_entropy needs logits of shape (..., V) with V >= 1; got {tuple(logits.shape)}")
    _check_targets("cross_entropy", targets, tuple(logits.shape[:-1]), logits.shape[-1], logits.device,
                   ignore_index, reduction, "logits")


def check_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                               ignore_index: int, reduction: str) -> None:
    _float_tensor(hidden, "hidden", "linear_cross_entropy")
    _float_tensor(weight, "weight", "linear_cross_entropy")
    if hidden.dim() == 0 or weight.dim() != 2 or hidden.shape[-1] != weight.shape[1] or weight.shape[0] == 0:
        raise ValueError(
            f"linear_cross_entropy needs hidden (..., C) and weight (V, C) with V >= 1; got hidden "
            f"{tuple(hidden.shape)}, weight {tuple(weight.shape)}"
        )
    if hidden.device != weight.device:
        raise ValueError(f"linear_cross_entropy needs hidden and weight on one device; got {hidden.device}, {weight.device}")
    _check_targets("linear_cross_entropy", targets, tuple(hidden.shape[:-1]), weight.shape[0], hidden.device,
                   ignore_index, reduction, "hidden @ weight.T")


def _rows(t: torch.Tensor) -> torch.Tensor:
    """(..., n) as (rows, n): a view when the leading dims flatten, else one copy."""
    return t.reshape(-1, t.shape[-1])


def _zero_loss(reduction: str, shape, *tensors: torch.Tensor) -> torch.Tensor:
    """The loss of no targets (0, or an empty per-target loss), connected to the inputs so that their
    gradient is a zero tensor."""
    zero = sum(t.sum() for t in tensors).float() * 0.0
    if reduction == "none":
        return torch.zeros(shape, dtype=torch.float32, device=tensors[0].device) + zero
    return zero


def checked(op: str, name: str, fn: Callable, validate: Optional[Callable[[torch.Tensor], None]]) -> Callable:
    """``fn`` (a method's op function, already given its options) behind the op's input checks: the
    function a bound op hands out."""
    if op == "softmax":
        def softmax(scores: torch.Tensor, scale: float = 1.0, causal: bool = False) -> torch.Tensor:
            check_scores(scores, causal)
            if validate is not None:
                validate(scores)
            if scores.numel() == 0:  # empty leading dimensions: nothing to compute
                return scores.clone()  # keeps the autograd graph of an empty input
            return fn(scores, float(scale), bool(causal))

        bound = softmax
    elif op == "attention":
        def attention(q, k, v, scale: Optional[float] = None, causal: bool = True, dropout_p: float = 0.0):
            check_attention(q, k, v, dropout_p)
            if validate is not None:
                validate(q)
            scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
            if q.numel() == 0 or k.shape[-2] == 0 or v.shape[-1] == 0:  # nothing to attend to: zeros
                out = q.new_zeros((*q.shape[:-1], v.shape[-1]))
                return out + (q.sum() + k.sum() + v.sum()) * 0
            return fn(q, k, v, scale, bool(causal), float(dropout_p))

        bound = attention
    elif op == "attention_qkv":
        def attention_qkv(qkv, n_head: int, scale: Optional[float] = None, causal: bool = True,
                          dropout_p: float = 0.0):
            check_attention_qkv(qkv, n_head, dropout_p)
            if validate is not None:
                validate(qkv)
            d = qkv.shape[-1] // (3 * n_head)
            scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
            if qkv.numel() == 0:  # no batch or no token: zeros
                return qkv.new_zeros((qkv.shape[0], n_head, qkv.shape[1], d)) + qkv.sum() * 0
            return fn(qkv, n_head, scale, bool(causal), float(dropout_p))

        bound = attention_qkv
    elif op == "cross_entropy":
        def cross_entropy(logits, targets, ignore_index: int = -100, reduction: str = "mean"):
            check_cross_entropy(logits, targets, ignore_index, reduction)
            if validate is not None:
                validate(logits)
            if targets.numel() == 0:
                return _zero_loss(reduction, targets.shape, logits)
            out = fn(_rows(logits), targets.reshape(-1).long(), int(ignore_index), reduction)
            return out.view(targets.shape) if reduction == "none" else out

        bound = cross_entropy
    elif op == "linear_cross_entropy":
        def linear_cross_entropy(hidden, weight, targets, ignore_index: int = -100, reduction: str = "mean"):
            check_linear_cross_entropy(hidden, weight, targets, ignore_index, reduction)
            if validate is not None:
                validate(hidden)
            if targets.numel() == 0:
                return _zero_loss(reduction, targets.shape, hidden, weight)
            out = fn(_rows(hidden), weight, targets.reshape(-1).long(), int(ignore_index), reduction)
            return out.view(targets.shape) if reduction == "none" else out

        bound = linear_cross_entropy
    else:  # pragma: no cover - registry checks the op name first
        raise ValueError(f"unknown op {op!r}")
    bound.__name__ = f"{op}[{name}]"
    bound.__qualname__ = bound.__name__
    return bound
