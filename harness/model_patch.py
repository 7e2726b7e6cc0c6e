"""Whole-model patches (``accel.model_patch``): a library's own patch of a Hugging Face model, applied as
shipped, so a study puts it beside the project's methods on the same model and batches.

``liger``: Liger-Kernel's ``apply_liger_kernel_to_<model_type>`` on the model, with Liger's defaults
(RoPE, RMSNorm, SwiGLU and its fused linear cross-entropy) or the options ``accel.model_patch_options``
gives (``conf/accel/liger_hf_flce.yaml``: only the fused linear cross-entropy). Where the patch
replaces the model's loss (``fused_linear_cross_entropy`` or ``cross_entropy``), the model's own forward
computes it (``HFCausalLM.native_loss``); the attention stays the accel config's (the public default,
SDPA, in ``liger_hf``).

Liger patches the modeling module of transformers (its classes' methods, module-level classes) as
well as the instance. A study trains every row in one process, so the module is restored right after
the patch: what it changed on a class is bound to this model's instances alone, and the module-level
names it replaced (Liger's RoPE function) are put back in place only while this model's forward runs
(``HFCausalLM.forward_globals``): the next model built is transformers' own.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import types
from typing import Any, Callable, Optional

import torch
import torch.nn as nn

#: model_patch name -> (why it cannot run here, or None; the patch)
MODEL_PATCHES: dict[str, tuple[Callable[[], Optional[str]], Callable[[nn.Module, dict], dict]]] = {}


class ModelPatchError(ValueError):
    """An ``accel.model_patch`` that cannot be applied (the message says what and what is accepted)."""


def liger_unavailable() -> Optional[str]:
    if importlib.util.find_spec("liger_kernel") is None:
        return "liger-kernel is not installed (pip install liger-kernel, or the project's 'bench' extra)"
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1":
        return "it needs a CUDA GPU and none was found (TRITON_INTERPRET=1 runs Triton's CPU interpreter)"
    return None


def _contained(model: nn.Module, patch: Callable[[], Any]) -> None:
    """Run ``patch`` (which may rewrite the HF model's modeling module and its classes), then restore the
    module and the classes: what changed on a class bound to the model's modules of that class, the
    module's changed names kept for the model's forward alone."""
    hf = model.hf
    module = importlib.import_module(type(hf).__module__)
    saved = dict(vars(module))
    classes = [c for c in saved.values() if inspect.isclass(c) and c.__module__ == module.__name__]
    saved_classes = {c: dict(vars(c)) for c in classes}
    patch()
    for cls, before in saved_classes.items():
        changed = {k: v for k, v in vars(cls).items() if before.get(k, _MISSING) is not v}
        for sub in (m for m in hf.modules() if type(m) is cls):
            for name, value in changed.items():
                setattr(sub, name, types.MethodType(value, sub) if inspect.isfunction(value) else value)
        for name in changed:
            if name in before:
                setattr(cls, name, before[name])
            else:
                delattr(cls, name)
    model.forward_globals = (module, {k: v for k, v in vars(module).items() if saved.get(k, _MISSING) is not v})
    for name in [k for k in vars(module) if k not in saved]:
        delattr(module, name)
    for name, value in saved.items():
        setattr(module, name, value)


_MISSING = object()


def apply_liger(model: nn.Module, options: dict) -> dict:
    """Liger's own patch for the model's type (``options``: its keywords; none: its defaults)."""
    from liger_kernel import transformers as liger  # here: an optional dependency, only for this patch

    model_type = model.config.model_type
    fn = getattr(liger, f"apply_liger_kernel_to_{model_type}", None)
    if fn is None:
        prefix = "apply_liger_kernel_to_"
        have = sorted(n.removeprefix(prefix) for n in dir(liger) if n.startswith(prefix))
        raise ModelPatchError(f"accel.model_patch=liger: Liger-Kernel has no patch for model_type {model_type!r}; "
                              f"it patches: {', '.join(have)}")
    _contained(model, lambda: fn(model=model.hf, **options))
    defaults = inspect.signature(fn).parameters
    said = {k: options.get(k, p.default) for k, p in defaults.items() if k != "model"}
    model.native_loss = bool(said.get("fused_linear_cross_entropy") or said.get("cross_entropy"))
    return {"model_patch": "liger", "function": fn.__name__, "options": said}


MODEL_PATCHES["liger"] = (liger_unavailable, apply_liger)


def patch_fuses_loss(name: Optional[str], options: dict) -> bool:
    """Whether the model patch ``name`` with ``options`` computes the loss as a fused linear cross-entropy
    (never the whole logits): Liger's ``fused_linear_cross_entropy``, on by its default."""
    return name == "liger" and bool(options.get("fused_linear_cross_entropy", True))


def model_patch_unavailable(name: Optional[str]) -> Optional[str]:
    """Why the model patch ``name`` cannot run here (None: it can, or there is none)."""
    if name is None:
        return None
    if name not in MODEL_PATCHES:
        return f"accel.model_patch={name!r} is not a model patch: one of {', '.join(MODEL_PATCHES)}"
    return MODEL_PATCHES[name][0]()


def apply_model_patch(model: nn.Module, name: str, options: Optional[dict] = None) -> dict:
    """The model patch ``name`` applied to ``model`` (a Hugging Face model: models.hf.HFCausalLM); its record."""
    if not hasattr(model, "hf"):
        raise ModelPatchError(f"accel.model_patch={name!r} patches a Hugging Face model: use a model.family=hf "
                              f"model (model=hf_*), not {type(model).__name__}")
    why = model_patch_unavailable(name)
    if why:
        raise ModelPatchError(f"accel.model_patch={name!r} cannot run here: {why}")
    return MODEL_PATCHES[name][1](model, dict(options or {}))
