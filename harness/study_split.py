"""A study's rows per softmax: what a method's loss kernel adds end to end.

A study row is one accel configuration (``conf/accel/``) run as it is: it patches the softmaxes its
``accel.patch`` names (by default the attention's and the loss's). Each configuration listed in
``study.loss_split`` (default ``[triton, cuda]``) is also run with ``accel.patch=[attention]``, and each
listed in ``study.linear_loss`` (default none) also with ``accel.loss_form=linear`` (the fused linear
cross-entropy, which never holds all the logits). The twins run beside every run of the configuration
in the study (eager, and with the whole model compiled when it is in ``study.compiled``), in the same
rounds, behind the same gate and parity. A listed configuration that is not in the study adds nothing.

Such a configuration's rows are labelled by what they ask to patch: ``triton: attention + loss`` (the
configuration as it is), ``triton: attention``, ``triton: attention + linear loss``; every row also
records what its runs actually patched (``patched``: native or composed, from the run's results). The
report's table "What the loss kernel adds" divides each row's tokens/s and peak memory by those of its
``: attention`` twin (same method, point and compile setting), paired by round with a 95% interval when
``study.repeats`` >= 2 (harness.stats); results.csv carries the same ratios (``vs_attention``,
``mem_vs_attention``).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Callable, Iterable, Mapping, NamedTuple, Optional

from harness.config import DEFAULT_PATCH, patch_words
from harness.stats import Estimate, round_ratio

#: variant -> the accel keys its runs override ("": the configuration as it is); the attention-only
#: twin patches no loss, so it drops the loss's own method (accel.loss_method) too
VARIANTS = {"": {}, "attention": {"patch": ["attention"], "loss_method": None}, "linear": {"loss_form": "linear"}}
#: study key -> the variant it adds to each configuration it lists
KEYS = {"loss_split": "attention", "linear_loss": "linear"}
#: the words of the row every ratio is over
ALONE = patch_words(["attention"])
#: statuses whose numbers are compared
COMPARED = ("PASS", "REFERENCE")


class Planned(NamedTuple):
    """One row of a study's plan."""

    method: str  # the accel configuration
    compiled: bool
    variant: str = ""  # a key of VARIANTS
    patch: str = ""  # what it asks to patch, in words, shown in its label ("": the configuration is not split)


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


def variants(study: Mapping, name: str, accel_for: Callable) -> list[tuple[str, str]]:
    """(variant, words) of the rows of accel configuration ``name``: itself, then its twins (a twin
    that would patch what the configuration already patches is left out); words only when split."""
    wanted = [""] + [v for key, v in KEYS.items() if name in list(study.get(key) or [])]
    seen: dict[str, str] = {}
    for v in wanted:
        a = accel_for(name, v)
        words = patch_words(a.patch, a.loss_form)
        if words not in seen.values():
            seen[v] = words
    return list(seen.items()) if len(seen) > 1 else [("", "")]


def expand(plan: Iterable[tuple[str, bool]], study: Mapping, accel_for: Callable) -> list[Planned]:
    """The plan with every split configuration's twins right after each of its runs."""
    return [Planned(m, c, v, w) for m, c in plan for v, w in variants(study, m, accel_for)]


def _misfit(a, variant: str, registered: Mapping) -> Optional[str]:
    """Why the configuration ``a`` (an AccelConfig) cannot get the twin ``variant`` (None: it can);
    ``registered``: method -> the ops it provides. The loss op is looked for in ``a.loss_method``."""
    from harness.accel import LOSS_OPS

    loss_method = a.get("loss_method") or a.method
    for name in dict.fromkeys((a.method, loss_method)):
        if registered.get(name) is None:
            return f"its {'method' if name == a.method else 'loss_method'} {name!r} is not registered"
    ops, loss_ops = registered[a.method], registered[loss_method]

    def its(op: str) -> str:
        from_loss = op in LOSS_OPS.values() and loss_method != a.method
        key, name, have = ("loss_method", loss_method, loss_ops) if from_loss else ("method", a.method, ops)
        return f"its {key} {name!r} provides {', '.join(have) or 'nothing'}"

    asked = patch_words(a.patch, a.loss_form)
    if variant == "attention":
        missing = [op for op, have in (("attention", ops), (LOSS_OPS[a.loss_form], loss_ops)) if op not in have]
        if missing:
            by = {its(op): [m for m in missing if its(m) == its(op)] for op in missing}
            return "; ".join(f"{who}: no {' and no '.join(ops_)}" for who, ops_ in by.items())
        if asked != patch_words(["attention", "loss"], a.loss_form):
            return f"it patches {asked} only"
    if variant == "linear":
        if "linear_cross_entropy" not in loss_ops:
            return f"{its('linear_cross_entropy')}, no linear_cross_entropy"
        if "loss" not in list(a.patch) or a.loss_form != "logits":
            return f"it patches {asked}, not the loss on the logits"
    return None


WHAT = {"attention": "runs each configuration it lists once more with accel.patch=[attention], to show what its "
                     "loss kernel adds, so each must patch both the attention and the loss",
        "linear": "runs each configuration it lists once more with accel.loss_form=linear (the fused linear "
                  "cross-entropy), so each must patch the loss on the logits with a method that provides "
                  "linear_cross_entropy"}


def check(study: Mapping, names: list[str], accel_for: Callable, bad: Callable) -> None:
    """study.loss_split and study.linear_loss (known names are checked before): every configuration
    listed can get its twin. ``bad(key, value, accepted)`` makes the ConfigError."""
    import kernels

    registered = {n: a.ops for n, a in kernels.available_methods(include_timing_only=True).items()}
    for key, variant in KEYS.items():
        for name in list(study.get(key) or []):
            why = _misfit(accel_for(name, ""), variant, registered)
            if why:
                fits = [n for n in names if not _misfit(accel_for(n, ""), variant, registered)]
                raise bad(f"study.{key}", name, f"study.{key} {WHAT[variant]}; {name} cannot: {why}. Those that "
                                                f"can: {', '.join(fits) or 'none'} ([] for none)")


# -- the ratios ---------------------------------------------------------------------------------


def twin(rows: list, r) -> Optional[object]:
    """The attention-only row of ``r``'s configuration (same point, compile setting; not a spread run)."""
    if not r.patch or r.patch == ALONE or r.role:
        return None
    return next((t for t in rows if t.patch == ALONE and t.method == r.method and t.compiled == r.compiled
                 and t.point == r.point and not t.role), None)


def _rounds(row, key: str) -> dict:
    return {run["round"]: run[key] for run in row.runs if run.get(key)}


def set_ratios(r, over, speed: str, memory: str) -> None:
    """r.<speed> and r.<memory> (each with _lo / _hi): r's tokens/s and peak memory over ``over``'s,
    paired by round (None: not compared)."""
    for attr, key in ((speed, "tokens_per_s"), (memory, "peak_mem_gib")):
        est: Estimate = (round_ratio(_rounds(r, key), _rounds(over, key)) if over is not None
                         else Estimate(None))
        setattr(r, attr, est.value)
        setattr(r, attr + "_lo", est.lo)
        setattr(r, attr + "_hi", est.hi)


def add_ratios(rows: list) -> None:
    """vs_attention / mem_vs_attention (with 95% intervals) of every split row over its attention-only
    twin, both having passed; the others get none."""
    for r in rows:
        t = twin(rows, r)
        compared = t is not None and r.status in COMPARED and t.status in COMPARED
        set_ratios(r, t if compared else None, "vs_attention", "mem_vs_attention")


def _ratio(r, attr: str) -> str:
    v, lo, hi = getattr(r, attr), getattr(r, attr + "_lo"), getattr(r, attr + "_hi")
    if v is None:
        return "-"
    text = f"{v:.3f}x"
    if lo is not None and hi is not None:
        text += f" [{lo:.3f}, {hi:.3f}]" + (" within noise" if lo <= 1.0 <= hi else "")
    return text


def ratio_lines(rows: list) -> list[str]:
    """The report's table: each split row over its attention-only twin."""
    pairs = [(r, t) for r in rows if (t := twin(rows, r)) is not None]
    if not pairs:
        return []
    lines = ["", "## What the loss kernel adds", "",
             "Each row's tokens/s and peak memory divided by those of the same method patching the attention only "
             "(its loss then the model's eager `F.cross_entropy`), paired by round; [lo, hi] is a 95% interval with "
             "repeats. Only rows that passed are compared.", "",
             "| method | patched | tokens/s | tokens/s vs attention only | peak GiB | peak memory vs attention only |",
             "|---|---|---|---|---|---|"]
    for r, t in pairs:
        where = f"{r.point}: " if r.point else ""
        tps = "-" if r.tokens_per_s is None else f"{r.tokens_per_s:,.0f}"
        mem = "-" if r.peak_mem_gib is None else f"{r.peak_mem_gib:.2f}"
        speed, memory = _ratio(r, "vs_attention"), _ratio(r, "mem_vs_attention")
        if r.vs_attention is None:
            speed = memory = f"- ({r.label}: {r.status}; {t.label}: {t.status})"
        lines.append(f"| {where}{r.label} vs {t.label} | {patched_words(r.patched) or '-'} | {tps} | {speed} | "
                     f"{mem} | {memory} |")
    return lines


# -- runs collected by harness.report -----------------------------------------------------------


def requested(res: Mapping) -> str:
    """What a run asked to patch, in words, from its results' config ('' when it did not record one)."""
    a = (res.get("config") or {}).get("accel") or {}
    return patch_words(a["patch"], a.get("loss_form") or "logits") if a.get("patch") is not None else ""


@functools.lru_cache(maxsize=None)
def _own_accel(name: str) -> dict:
    """The accel configuration ``name`` as its conf/accel file sets it ({} without one here)."""
    from omegaconf import OmegaConf

    from harness.config import CONF_DIR

    path = Path(CONF_DIR) / "accel" / f"{name}.yaml"
    return OmegaConf.to_container(OmegaConf.load(path)) if name and path.is_file() else {}


def own_words(name: str) -> str:
    """What the accel configuration ``name`` patches as it is (its conf/accel file's patch and loss_form,
    e.g. 'attention + linear loss' for flash_linear); DEFAULT_PATCH when there is no such file here."""
    a = _own_accel(name)
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
    return configured({"config": {"accel": _own_accel(name)}})


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
