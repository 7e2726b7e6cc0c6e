"""Apply an acceleration method to a built model: the only place where kernels/ and models/ meet.

``accel.patch`` names the softmaxes the method computes (``attention``, ``loss``); each is patched where
the method provides the op: the attention core from the method's ``attention`` (native, or composed from
its softmax: q k^T -> softmax -> v; k and v with fewer heads than q, grouped-query attention, as the
contract takes them), and from its native ``attention_qkv`` where it has one (the attention of the
unsplit projection, grouped or not: one gradient for it, no concatenation), the loss from its
``cross_entropy`` (``loss_form: logits``) or ``linear_cross_entropy`` (``loss_form: linear``, native or
composed). A softmax the method does not provide keeps the model's own eager PyTorch, and the record
says so.

``accel.loss_method`` takes the loss from another method than the attention (the project's fused
attention with Triton's fused linear cross-entropy: ``accel=flash_linear``). It must provide the loss
op, and the loss must be in ``accel.patch``; ``accel.options`` are ``method``'s, so a different loss
method runs with its defaults.

``accel.model_patch`` applies a library's own whole-model patch to a Hugging Face model as shipped
(harness.model_patch: Liger's ``apply_liger_kernel_to_<type>``), after the softmaxes above.

Which op computes which softmax is the op table's (``kernels.ops``: each entry's ``seam`` and, for a
loss, its ``form``); :func:`mark_ops` wraps what the model's seams call for a measurement
(harness.breakdown's marks).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Optional

import torch.nn as nn

import kernels
from kernels import ops
from harness.model_patch import apply_model_patch
from models import attention_cores, set_attention, set_loss

_ATTENTION = [e for e in ops.TABLE.values() if e.seam == "attention"]
#: the op of the model's attention core on q, k, v (``attention_fn``)
ATTENTION_OP = next(e.name for e in _ATTENTION if not e.variant)
#: its variant on the unsplit projection (the core's ``qkv_fn``), bound where the method implements it
QKV_OP = next(e.name for e in _ATTENTION if e.variant)
#: accel.loss_form -> the op that computes the loss in that form
LOSS_OPS = {e.form: e.name for e in ops.TABLE.values() if e.seam == "loss"}


class AccelError(ValueError):
    """An accel configuration that cannot be applied (the message says what and what is accepted)."""


@dataclass
class Applied:
    """What a method patched: op -> 'native' | 'composed' for each softmax, None where the model keeps
    its own eager PyTorch; ``undo()`` restores the model."""

    method: str
    attention: Optional[str] = None
    attention_qkv: bool = False  # the method's native attention_qkv runs the model's attention
    loss: Optional[str] = None
    loss_form: str = "logits"
    options: dict = field(default_factory=dict)
    loss_method: Optional[str] = None  # the method that computes the loss; None: ``method``
    model_patch: Optional[dict] = None  # a whole-model patch's record (harness.model_patch), applied after
    _undo: list = field(default_factory=list, repr=False)

    @property
    def loss_from(self) -> str:
        """The method the loss is bound from."""
        return self.loss_method or self.method

    @property
    def loss_options(self) -> dict:
        """The options the loss is bound with: ``options`` are ``method``'s alone."""
        return dict(self.options) if self.loss_from == self.method else {}

    def calls(self) -> dict[str, tuple[str, str, dict]]:
        """seam ('attention', 'loss') -> (method, op, options): the op the model calls at each softmax this
        run patched, and what it is bound from."""
        out = {}
        if self.attention:
            out["attention"] = (self.method, QKV_OP if self.attention_qkv else ATTENTION_OP, dict(self.options))
        if self.loss:
            out["loss"] = (self.loss_from, LOSS_OPS[self.loss_form], self.loss_options)
        return out

    def undo(self) -> None:
        for fn in reversed(self._undo):
            fn()
        self._undo.clear()

    def as_dict(self) -> dict:
        return {"method": self.method, "attention": self.attention, "attention_qkv": self.attention_qkv,
                "loss": self.loss,
                "loss_form": self.loss_form, "options": dict(self.options),
                "loss_method": self.loss_from if self.loss else None, "model_patch": self.model_patch}

    def describe(self) -> str:
        att = f"attention={self.attention or 'eager torch (not patched)'}{' (qkv)' if self.attention_qkv else ''}"
        loss = f"loss={self.loss + ' ' + self.loss_form if self.loss else 'eager F.cross_entropy (not patched)'}"
        if self.loss and self.loss_from != self.method:
            att, loss = f"{att} ({self.method})", f"{loss} ({self.loss_from})"
        whole = f", then {self.model_patch['function']}" if self.model_patch else ""
        return f"{att}, {loss}{whole}"


def check_accel(method: str, patch: Iterable[str] = ("attention", "loss"), loss_form: str = "logits",
                loss_method: Optional[str] = None) -> tuple[kernels.Method, kernels.Method, str]:
    """(method, loss method, loss op) of an accel configuration that can be applied, else the clear error:
    the registry's for unknown or unavailable methods, AccelError for a combination that cannot be
    patched. No model needed: ``harness.train`` calls it before any work or directory."""
    m = kernels.get_method(method)
    lm = kernels.get_method(loss_method) if loss_method is not None else m
    patch = list(patch)
    if loss_form not in LOSS_OPS:
        raise AccelError(f"accel.loss_form={loss_form!r} is not accepted: one of {', '.join(LOSS_OPS)}")
    op = LOSS_OPS[loss_form]
    if loss_method is not None:
        if "loss" not in patch:
            raise AccelError(
                f"accel.loss_method={loss_method!r} names the method of the loss, but accel.patch={patch} does not "
                f"patch the loss (add loss to accel.patch, or leave accel.loss_method null)"
            )
        if not lm.provides(op):
            raise AccelError(
                f"accel.loss_method={loss_method!r} with accel.loss_form={loss_form} needs a method that provides "
                f"{op}; {loss_method!r} provides: {', '.join(lm.ops())} (methods that provide {op} here: "
                f"{', '.join(kernels.runnable_methods(op=op)) or 'none'})"
            )
    if "loss" in patch and loss_form == "linear" and not lm.provides(op):
        raise AccelError(
            f"accel.loss_form=linear needs a method that provides linear_cross_entropy; {method!r} provides: "
            f"{', '.join(m.ops())} (use loss_form=logits, or a method with a cross-entropy)"
        )
    if patch and not (("attention" in patch and m.provides(ATTENTION_OP)) or ("loss" in patch and lm.provides(op))):
        raise AccelError(
            f"accel.patch={patch}: method {method!r} provides none of these softmaxes (it provides "
            f"{', '.join(m.ops())}); patch accepts attention and loss"
        )
    return m, lm, op


def apply_accel(model: nn.Module, method: str, patch: Iterable[str] = ("attention", "loss"),
                loss_form: str = "logits", options: Optional[Mapping[str, Any]] = None,
                loss_method: Optional[str] = None, qkv: bool = True, model_patch: Optional[str] = None,
                model_patch_options: Optional[Mapping[str, Any]] = None) -> Applied:
    """Patch the softmaxes ``patch`` names that ``method`` provides (the loss from ``loss_method`` when
    given; ``options`` go to ``method`` alone; ``qkv``: the method's native ``attention_qkv``, where it has
    one, on the unsplit projection), then the whole-model patch ``model_patch`` with its options; every
    error of ``check_accel`` comes before anything is changed."""
    patch = list(patch)
    m, lm, op = check_accel(method, patch, loss_form, loss_method)
    applied = Applied(method, loss_form=loss_form, options=dict(options or {}),
                      loss_method=lm.name if lm is not m else None)
    if "attention" in patch and m.provides(ATTENTION_OP):
        fn = kernels.bind(method, ATTENTION_OP, **applied.options)
        # (a model with no fused q/k/v projection, a Hugging Face model's, has nothing for attention_qkv to take)
        applied.attention_qkv = qkv and m.provides(QKV_OP) == "native" and getattr(model, "fused_qkv", True)
        qkv_fn = kernels.bind(method, QKV_OP, **applied.options) if applied.attention_qkv else None
        applied._undo.append(set_attention(model, fn, qkv_fn))
        applied.attention = m.provides(ATTENTION_OP)
    if "loss" in patch and lm.provides(op):
        fn = kernels.bind(lm.name, op, **applied.loss_options)
        applied._undo.append(set_loss(model, functools.partial(fn, ignore_index=-100, reduction="mean"), loss_form))
        applied.loss = lm.provides(op)
    if model_patch is not None:
        applied.model_patch = apply_model_patch(model, model_patch, dict(model_patch_options or {}))
    return applied


def patched_ops(applied: Applied) -> dict[str, Callable]:
    """op -> the bound function the model holds, for every softmax ``applied`` patched."""
    out = {}
    if applied.attention:
        out[ATTENTION_OP] = kernels.bind(applied.method, ATTENTION_OP, **applied.options)
    for method, op, options in applied.calls().values():
        out[op] = kernels.bind(method, op, **options)
    return out


def mark_ops(model: nn.Module, applied: Optional[Applied],
             wrap: Callable[[str, Callable], Callable]) -> Callable[[], None]:
    """Wrap what ``model``'s seams call, for the time of a measurement: ``wrap(part, fn)`` on the attention
    core's functions as they are now (``attention``, and ``attention_qkv`` where the core has one) and on the
    loss (``loss``: whatever computes it, patched or the model's own, in its form). Where ``applied`` composed
    the attention from the method's softmax, the attention is rebuilt around the wrapped bound softmax as
    kernels composes it (``wrap('softmax', fn)`` then sees it inside). Returns the undo."""
    cores = [a.core for a in attention_cores(model)]
    if applied is not None and applied.attention == "composed":
        attention_fn, qkv_fn = _recomposed(applied.method, ATTENTION_OP, applied.options, wrap), None
    else:
        attention_fn, qkv_fn = cores[0].attention_fn, getattr(cores[0], "qkv_fn", None)
    undo = [set_attention(model, wrap(ATTENTION_OP, attention_fn), qkv_fn and wrap(QKV_OP, qkv_fn)),
            set_loss(model, wrap("loss", model.loss_fn), model.loss_form)]

    def undo_all() -> None:
        for fn in reversed(undo):
            fn()

    return undo_all


def _recomposed(method: str, op: str, options: dict, wrap: Callable[[str, Callable], Callable]) -> Callable:
    """``method``'s composed ``op`` rebuilt around the wrapped op it is built from (the bound one where
    the method implements it, else itself rebuilt), as the op table's composition builds it."""
    entry = ops.get(op)
    base = entry.composed_from
    if kernels.get_method(method).provides(base) == "native":
        inner = kernels.bind(method, base, **options)
    else:
        inner = _recomposed(method, base, options, wrap)
    return entry.compose(wrap(base, inner))
