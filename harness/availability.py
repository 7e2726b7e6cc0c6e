"""Which accel configurations (``conf/accel/*.yaml``) can run on this machine, and why not: what
``--help`` lists, what a run refuses before any work (with the configurations that can run here), and
the rows a study skips.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

from omegaconf import OmegaConf

import kernels
from harness.config import CONF_DIR, PATCHABLE, accel_methods, group_options
from harness.model_patch import model_patch_unavailable


def leading_comment(path: Path) -> str:
    """What a YAML file is, from its leading comment block (its first sentence), '@package' lines aside."""
    parts = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line.startswith("#"):
            break
        if "@package" not in line:
            parts.append(line.lstrip("#").strip())
    text = " ".join(p for p in parts if p)
    return re.split(r"\.\s+(?=[A-Z])", text)[0].rstrip(".")


def accel_choices(conf_dir: Optional[str] = None) -> list[dict]:
    """Every accel configuration (conf/accel/*.yaml): name, method, options, summary, and whether it
    can run here (``reason`` says why not)."""
    conf_dir = conf_dir or CONF_DIR
    known = kernels.available_methods(include_timing_only=True)
    out = []
    for name in group_options("accel", conf_dir):
        path = Path(conf_dir) / "accel" / f"{name}.yaml"
        raw = OmegaConf.load(path)
        method, options = str(raw.get("method")), dict(raw.get("options") or {})
        loss_method = raw.get("loss_method")
        a = known.get(method)
        reason = accel_unavailable(method, options, loss_method, raw.get("patch", PATCHABLE), raw.get("model_patch"))
        # the plain config says what its method is; a variant (sdpa_flash) says what it changes
        summary = a.summary if (a and (name == method or not leading_comment(path))) else leading_comment(path)
        exact = all(known[m].exact for m in (method, loss_method) if m in known)
        out.append({"name": name, "method": method, "options": options, "loss_method": loss_method,
                    "available": not reason, "reason": reason or "", "summary": summary,
                    "exact": exact, "comment": leading_comment(path)})
    return out


def runnable_accel_names(conf_dir: Optional[str] = None) -> list[str]:
    """The accel configurations that can run on this machine."""
    return [c["name"] for c in accel_choices(conf_dir) if c["available"]]


def accel_unavailable(method: str, options: dict, loss_method: Optional[str] = None, patch=PATCHABLE,
                      model_patch: Optional[str] = None) -> Optional[str]:
    """Why an accel configuration's methods (``method``, and ``loss_method`` for the loss) or its
    whole-model patch cannot run here (None: they can)."""
    for name, opts in accel_methods(method, loss_method, options, patch):
        try:
            reason = kernels.unavailable_reason(name, **opts)
        except (kernels.UnknownMethodError, ValueError) as exc:
            reason = str(exc)
        if reason:
            return reason if name == method else f"its loss_method {name!r}: {reason}"
    why = model_patch_unavailable(model_patch)
    return f"its model_patch {model_patch!r}: {why}" if why else None


def method_unavailable_message(accel_name: str, method: str, options: dict, loss_method: Optional[str] = None,
                               patch=PATCHABLE, model_patch: Optional[str] = None) -> Optional[str]:
    """None when accel=``accel_name`` can run here; else why not and which accel options can."""
    reason = accel_unavailable(method, options, loss_method, patch, model_patch)
    if not reason:
        return None
    which = f"accel={accel_name}" + (f" (method {method!r})" if method != accel_name else "")
    return (f"{which} cannot run here: {reason.rstrip('.')}. "
            f"accel options that can run here: {', '.join(runnable_accel_names()) or 'none'}.")
