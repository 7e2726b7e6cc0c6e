"""``accel.compiled_loss_method``: an accel configuration as it runs with the whole model compiled.

A loss method whose op does not trace under whole-model ``torch.compile`` cannot be compiled with the
model (Liger's fused linear cross-entropy: a fake-tensor error in its addmm). A configuration declares
the method that computes its loss there instead: ``conf/accel/public.yaml`` (SDPA + Liger's fused linear
cross-entropy) declares ``compile``, so the compiled public stack is SDPA + the compiled cross-entropy.

Declared, never silent: a run with ``compile_model=true`` takes ``accel.loss_method`` from it and says
so on its console (its record's config holds the method that ran); a study labels such a row by the
method that ran (``public [loss_method=compile, backend=auto] + compile``) and its report says what was
replaced and why (harness.study.compiled). Eager runs, and configurations that patch no loss, are left
as they are.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping, Optional

from omegaconf import DictConfig, open_dict

from harness.config import PATCHABLE


def compiled_loss_swap(accel: Mapping[str, Any], compile_model: bool) -> Optional[tuple[str, str]]:
    """(the loss method ``accel`` names, the method that computes its loss instead) where it runs with the
    whole model compiled and declares ``compiled_loss_method``; None where nothing changes."""
    new = accel.get("compiled_loss_method")
    patch = accel.get("patch")
    if not compile_model or not new or "loss" not in list(PATCHABLE if patch is None else patch):
        return None
    old = accel.get("loss_method") or accel.get("method")
    return None if old == new else (str(old), str(new))


def as_compiled(accel: DictConfig, compile_model: bool) -> DictConfig:
    """``accel`` as it runs (with the whole model compiled when ``compile_model``): its loss method replaced
    by ``compiled_loss_method`` where it declares one; else ``accel`` itself. Applying it twice changes
    nothing more."""
    swap = compiled_loss_swap(accel, compile_model)
    if swap is None:
        return accel
    out = copy.deepcopy(accel)
    with open_dict(out):
        out.loss_method = swap[1]
    return out


def fallback_note(accel: Mapping[str, Any], compile_model: bool) -> str:
    """What :func:`as_compiled` replaces in ``accel``, and why, in words ('' where nothing)."""
    swap = compiled_loss_swap(accel, compile_model)
    if swap is None:
        return ""
    old, new = swap
    return (f"with the whole model compiled, the loss comes from {new} instead of {old} "
            f"(accel.compiled_loss_method: {old}'s loss does not trace under torch.compile)")


def with_compiled_fallback(cfg: DictConfig) -> tuple[DictConfig, str]:
    """A run's config with its accel as it runs (:func:`as_compiled` at ``cfg.compile_model``), and the note
    ('' and ``cfg`` itself where nothing changes)."""
    swap = compiled_loss_swap(cfg.accel, bool(cfg.compile_model))
    if swap is None:
        return cfg, ""
    out = copy.deepcopy(cfg)  # (one copy: the accel node is replaced in it, not copied again)
    with open_dict(out.accel):
        out.accel.loss_method = swap[1]
    return out, fallback_note(cfg.accel, True)
