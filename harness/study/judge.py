"""How a study judges its rows: parity against the reference (within a tolerance from the reference's
spread over two data orders, or a fixed one), the speedups against the baseline and the reference
(paired by round), the loss split's and the compiled rows' ratios. ``finish`` runs it per point; the
report (harness.study.report) only writes what it decided. The rules: docs/studies.md."""

from __future__ import annotations

import math
from typing import Any

from omegaconf import DictConfig, OmegaConf

from harness.study.compiled import add_compiled_ratios
from harness.study.drift import drift_of
from harness.study.parity import envelope, judge
from harness.study.ratios import add_ratios
from harness.study.rows import NO_NUMBERS, StudyRow
from harness.study.stats import round_ratio


def _study(cfg: DictConfig, key: str, default: Any = None) -> Any:
    v = cfg.study.get(key) if "study" in cfg else None
    return default if v is None else v


def parity_window(cfg: DictConfig) -> int:
    """The parity window: study.parity_steps, or the whole run."""
    steps = _study(cfg, "parity_steps")
    if steps is None:
        steps = OmegaConf.select(cfg, "trainer.max_steps", default=None)
    return int(steps) if isinstance(steps, int) else 10**9


def finish(rows: list[StudyRow], cfg: DictConfig) -> dict[str, dict]:
    """Parity and speedups, point by point; returns the parity settings each point used (point ->
    {"spread", "tolerance", ...}) for the report."""
    settings = {}
    for point in dict.fromkeys(r.point for r in rows):
        settings[point] = _finish_point([r for r in rows if r.point == point], cfg)
    return settings


def _curve(r: StudyRow) -> list:
    return r.probe_curve or [[i, v] for i, v in enumerate(r.loss_curve)]


def _finish_point(rows: list[StudyRow], cfg: DictConfig) -> dict:
    ref_name, base_name = cfg.study.reference, cfg.study.baseline
    k, floor, fixed = float(_study(cfg, "parity_k", 3.0)), float(_study(cfg, "parity_floor", 0.005)), \
        _study(cfg, "parity_tol")
    steps = parity_window(cfg)
    ref = next((r for r in rows if r.method == ref_name and not r.compiled and not r.role and not r.variant
                and r.runs and r.status not in NO_NUMBERS), None)
    spread_row = next((r for r in rows if r.role == "spread" and r.runs and r.status not in NO_NUMBERS), None)
    on_probe = bool(ref and ref.probe_curve)
    info: dict = {"reference": ref.label if ref else None, "k": k, "floor": floor, "fixed": fixed, "steps": steps,
                  "probe": on_probe, "spread": None, "spread_run": spread_row.label if spread_row else None}
    spread_curve = _curve(spread_row) if (spread_row and ref and fixed is None) else None
    if spread_curve and ref:
        env = envelope(spread_curve, _curve(ref), steps)
        info["spread"] = max(env.values()) if env else None
    for r in rows:
        if r.status in NO_NUMBERS:
            r.parity = r.parity or "n/a"
            continue
        if not r.exact:
            r.status, r.parity, r.judged = "TIMING-ONLY", "n/a", "timing only"
            continue
        if ref is None:  # it ran, but nothing says it trained right: numbers shown, no speedup
            r.parity, r.status = "n/a", "UNCHECKED" if r.status == "PASS" else r.status
            r.reason = r.reason or f"no reference run ({ref_name}) here to compare with"
            continue
        if r is ref:
            r.parity, r.status, r.loss_diff_vs_reference = "reference", "REFERENCE", 0.0
            continue
        if r.role == "spread":
            r.parity, r.status = "spread", "REFERENCE"
            r.reason = r.reason or "the reference on another data order: its spread sets the parity tolerance"
            continue
        verdicts = []
        for run in (r.runs or [{}]):  # every repeat must pass; the worst one is reported
            curve = run.get("probe_curve") or [[i, v] for i, v in enumerate(run.get("loss_curve") or [])]
            verdicts.append(judge(curve, _curve(ref), steps, k, floor, spread_curve, fixed))
        worst = max([v for v in verdicts if not v.passed] or verdicts,
                    key=lambda v: v.margin if v.margin == v.margin else math.inf)
        r.parity_dev, r.parity_tol, r.parity_step = worst.dev, worst.tol, worst.step
        r.parity = "pass" if worst.passed else "FAIL"
        if r.final_loss is not None and ref.final_loss is not None:
            r.loss_diff_vs_reference = r.final_loss - ref.final_loss
        if not worst.passed:
            r.status, r.reason = "FAIL", worst.reason
    info["tolerance_end"] = None if ref is None else (
        fixed if fixed is not None else max(floor, k * (info["spread"] or 0.0)))
    base = next((r for r in rows if r.method == base_name and not r.compiled and not r.role and not r.variant
                 and r.status in ("PASS", "REFERENCE")), None)
    for r in rows:
        r.noise = ""
        if r.status not in ("PASS", "REFERENCE") or not r.tokens_per_s or r.role:
            continue  # no speedup for a failed, crashed or timing-only method
        notes = []
        for other, attr, name in ((base, "speedup_vs_baseline", base_name), (ref, "speedup_vs_reference", ref_name)):
            if other is None or not other.tokens_per_s:
                continue
            est = speedup(r, other)
            setattr(r, attr, est.value)
            setattr(r, attr + "_lo", est.lo)
            setattr(r, attr + "_hi", est.hi)
            if est.within_noise and r is not other:
                notes.append(f"vs {name}")
        if notes:
            r.noise = "within noise (" + ", ".join(notes) + ")"
    add_ratios(rows)
    add_compiled_ratios(rows, base_name)
    _mark_drift(rows, info)
    return info


#: a row's comparisons with other runs (speedups and ratios), the figures a drifting machine spoils
COMPARISONS = ("speedup_vs_baseline", "speedup_vs_reference", "vs_attention", "vs_compiled_baseline")


def _mark_drift(rows: list[StudyRow], info: dict) -> None:
    """The machine's speed over the point's runs (harness.study.drift) into ``info["drift"]``; every row
    with a comparison marked untrusted when it changed beyond the limit."""
    drift = info["drift"] = drift_of(rows)
    for r in rows:
        r.drift = drift["drift"] if drift else None
        r.untrusted = bool(drift and drift["untrusted"] and any(getattr(r, a) is not None for a in COMPARISONS))


def speedup(a: StudyRow, b: StudyRow):
    """a's tokens/s over b's: paired by round where both ran in the same rounds (harness.study.stats)."""
    return round_ratio({run["round"]: run["tokens_per_s"] for run in a.runs if run.get("tokens_per_s")},
                       {run["round"]: run["tokens_per_s"] for run in b.runs if run.get("tokens_per_s")})
