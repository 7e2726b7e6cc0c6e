"""What a study row asked to patch and what its runs patched, in words: the labels of the loss split's
rows (``triton: attention + loss``, ``triton: attention``, ``triton: attention + linear loss``; the
plan's twins, harness.study.plan) and, for runs that ``harness.report`` collects from any directory,
what each asked for, read back from its results' config (``mark_split`` labels the rows of one
configuration that asked for different softmaxes).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Mapping, Optional

from omegaconf import OmegaConf

from harness.config import CONF_DIR, DEFAULT_PATCH, patch_words

#: the words of the row every loss-split ratio is over (harness.study.ratios)
ALONE = patch_words(["attention"])


def patched_words(patched: Optional[Mapping], detail: bool = True) -> str:
    """What a run patched (its results' ``patched``, harness.accel.Applied.as_dict), in words:
    'attention (composed) + loss (native)', 'attention (native, qkv)' (the method's attention_qkv); 'none' when
    nothing; '' when not known (it did not run)."""
    if not patched:
        return ""
    parts = []
    if patched.get("attention"):
        qkv = ", qkv" if patched.get("attention_qkv") else ""  # (the op on the unsplit projection)
        parts.append("attention" + (f" ({patched['attention']}{qkv})" if detail else ""))
    if patched.get("loss"):
        loss = "linear loss" if patched.get("loss_form") == "linear" else "loss"
        other = patched.get("loss_method") if patched.get("loss_method") not in (None, patched.get("method")) else None
        parts.append(loss + (f" ({patched['loss']}{', ' + other if other else ''})" if detail else ""))
    return " + ".join(parts) or "none"


def requested(res: Mapping) -> str:
    """What a run asked to patch, in words, from its results' config ('' when it did not record one)."""
    a = (res.get("config") or {}).get("accel") or {}
    return patch_words(a["patch"], a.get("loss_form") or "logits") if a.get("patch") is not None else ""


@functools.lru_cache(maxsize=None)
def own_accel(name: str) -> dict:
    """The accel configuration ``name`` as its conf/accel file sets it ({} without one here)."""
    path = Path(CONF_DIR) / "accel" / f"{name}.yaml"
    return OmegaConf.to_container(OmegaConf.load(path)) if name and path.is_file() else {}


def own_words(name: str) -> str:
    """What the accel configuration ``name`` patches as it is (its conf/accel file's patch and loss_form,
    e.g. 'attention + linear loss' for flash_linear); DEFAULT_PATCH when there is no such file here."""
    a = own_accel(name)
    return patch_words(list(a.get("patch") or ["attention", "loss"]), str(a.get("loss_form") or "logits"))


def configured(res: Mapping) -> str:
    """The accel keys beyond the patch that change what a run computed (``loss_method``, ``options``), from
    its results' config, as one string: runs of one configuration name that differ in them are different
    rows ('' for the configuration's own: none recorded)."""
    a = (res.get("config") or {}).get("accel") or {}
    parts = [f"loss_method={a['loss_method']}"] if a.get("loss_method") else []
    parts += [f"{k}={v}" for k, v in sorted((a.get("options") or {}).items())]
    return ", ".join(parts)


def own_setting(name: str) -> str:
    """``configured`` of the accel configuration ``name`` as its conf/accel file sets it ('' without one)."""
    return configured({"config": {"accel": own_accel(name)}})


def split_rank(words: str, own: str = DEFAULT_PATCH) -> int:
    """Where a run that asked for ``words`` goes among its configuration's rows (``own``: what the
    configuration patches as it is): as the study plans them."""
    return 0 if words in ("", own) else 1 if words == ALONE else 2


def mark_split(rows: list) -> None:
    """Rows of one configuration (point, compile setting) that asked for different softmaxes: label each
    by what it asked for and set its variant; the others lose their words (not split)."""
    groups: dict[tuple, list] = {}
    for r in rows:
        groups.setdefault((r.point, r.method, r.compiled, r.role), []).append(r)
    names = {ALONE: "attention", patch_words(["attention", "loss"], "linear"): "linear"}
    for group in groups.values():
        # '' (a study.json row of a configuration as it is) asks for what the configuration patches as it is
        own = own_words(group[0].method)
        if len({r.patch or own for r in group}) < 2:
            for r in group:
                r.patch = ""
            continue
        for r in group:
            r.variant = "" if r.patch in (own, "") else names.get(r.patch, r.patch)
