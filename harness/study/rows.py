"""A study's rows: one per method (accel configuration, compile setting, loss-split variant) and sweep
point, :class:`StudyRow`, holding its repeats in ``runs`` and the figures aggregated over them (medians,
the tokens/s interval, the worst step spread). harness.study.judge fills in parity and the speedups,
harness.study.report writes them out.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Optional

from harness.study.stats import log_interval
from harness.outcomes import NOISY_SPREAD

#: Statuses that leave a row without any number to compare.
NO_NUMBERS = ("SKIPPED", "CRASH", "FAIL", "OOM")


@dataclass
class StudyRow:
    method: str
    compiled: bool
    status: str  # PASS | FAIL | CRASH | OOM | SKIPPED | TIMING-ONLY | REFERENCE | UNCHECKED (no reference)
    reason: str = ""
    exact: bool = True  # False: a timing-only method (the registry's flag): timed, never compared
    approximate: bool = False  # approximate by design (the registry's flag): judged by parity alone
    judged: str = ""  # what decided its status: gate + parity | parity only (...) | timing only
    point: str = ""  # the sweep point ("T=1024 batch 16", "gpt2m"); "" outside a sweep
    point_values: dict = field(default_factory=dict)  # context / batch_size / model of the point
    role: str = ""  # "" | "spread": the second reference run (another data order), for the tolerance
    variant: str = ""  # "" (the accel config as it is) | a twin of harness.study.plan: attention | linear
    patch: str = ""  # what it asked to patch, in words, shown in the label ("": its configuration is not split)
    setting: str = ""  # accel keys a run set beyond its configuration's own (harness.report: 'loss_method=naive')
    fallback: str = ""  # what a compiled row ran instead of its configuration's loss method, and why (harness.fallback)
    data_seed: Optional[int] = None  # the batch order's seed, when it is not the run's seed
    tokens_per_s: Optional[float] = None  # median over repeats
    tokens_per_s_lo: Optional[float] = None  # 95% interval (repeats >= stats.MIN_INTERVAL_RUNS)
    tokens_per_s_hi: Optional[float] = None
    speedup_vs_baseline: Optional[float] = None
    speedup_vs_baseline_lo: Optional[float] = None
    speedup_vs_baseline_hi: Optional[float] = None
    speedup_vs_reference: Optional[float] = None
    speedup_vs_reference_lo: Optional[float] = None
    speedup_vs_reference_hi: Optional[float] = None
    noise: str = ""  # "within noise" when an interval of a speedup contains 1.0 (vs baseline / reference)
    step_ms_p50: Optional[float] = None
    step_ms_p90: Optional[float] = None
    step_spread: Optional[float] = None  # p90 / p50 of the step times, the worst repeat
    noisy: Optional[bool] = None  # some repeat's step_spread > NOISY_SPREAD
    drift: Optional[float] = None  # the machine's speed change over its point's runs (harness.study.drift)
    untrusted: Optional[bool] = None  # its comparisons are not trusted: drift beyond drift.DRIFT_LIMIT
    peak_mem_gib: Optional[float] = None
    vs_attention: Optional[float] = None  # tokens/s over its attention-only twin (harness.study.ratios)
    vs_attention_lo: Optional[float] = None
    vs_attention_hi: Optional[float] = None
    mem_vs_attention: Optional[float] = None  # peak memory over its attention-only twin
    mem_vs_attention_lo: Optional[float] = None
    mem_vs_attention_hi: Optional[float] = None
    vs_compiled_baseline: Optional[float] = None  # a compiled row's tokens/s over the baseline's compiled row
    vs_compiled_baseline_lo: Optional[float] = None  # (harness.study.compiled)
    vs_compiled_baseline_hi: Optional[float] = None
    mem_vs_compiled_baseline: Optional[float] = None  # its peak memory over that row's
    mem_vs_compiled_baseline_lo: Optional[float] = None
    mem_vs_compiled_baseline_hi: Optional[float] = None
    mfu: Optional[float] = None
    warmup_s: Optional[float] = None
    final_loss: Optional[float] = None
    loss_diff_vs_reference: Optional[float] = None
    parity: str = ""  # pass | FAIL | n/a | reference | spread
    parity_dev: Optional[float] = None  # relative difference from the reference at the worst probe point
    parity_tol: Optional[float] = None  # the tolerance there
    parity_step: Optional[int] = None
    repeats: int = 0  # runs that produced numbers
    breakdown: Optional[dict] = None  # where a step's time goes (harness.breakdown)
    patched: Optional[dict] = None  # which softmaxes the method computed (harness.accel.Applied.as_dict)
    runs: list = field(default_factory=list, repr=False)  # one dict per repeat (see add_run)
    loss_curve: list = field(default_factory=list, repr=False)  # the first repeat's train loss per step
    probe_curve: list = field(default_factory=list, repr=False)  # the first repeat's probe (step, loss)

    @property
    def label(self) -> str:
        extra = f" (data seed {self.data_seed})" if self.role == "spread" else ""
        patch = f": {self.patch}" if self.patch else ""
        setting = f" [{self.setting}]" if self.setting else ""
        return self.method + setting + (" + compile" if self.compiled else "") + patch + extra

    @property
    def slug(self) -> str:
        return self.label.replace(": ", "-").replace(" + ", "+").replace(" (data seed ", "-dataseed") \
            .replace(")", "").replace(" [", "-").replace("]", "").replace(", ", "-").replace(" ", "_")


def add_run(row: StudyRow, res: dict, round_: int, probe_curve: Optional[list] = None) -> None:
    """Record one repeat of ``row`` from its results.json record and aggregate the repeats."""
    row.runs.append({
        "round": round_, "run_dir": res.get("run_dir"), "status": res.get("status"),
        "tokens_per_s": res.get("tokens_per_s"), "step_ms_p50": res.get("step_ms_p50"),
        "step_ms_p90": res.get("step_ms_p90"), "step_ms_spread": res.get("step_ms_spread"),
        "noisy": res.get("noisy"), "peak_mem_gib": res.get("peak_mem_gib"), "mfu": res.get("mfu"),
        "warmup_s": res.get("warmup_s"), "final_loss": res.get("final_train_loss"),
        "loss_curve": list(res.get("loss_curve") or []), "probe_curve": [list(p) for p in (probe_curve or [])],
        "calibration_ms": list(res.get("calibration_ms") or []),  # before and after the run (harness.study.drift)
    })
    aggregate(row)


def _median(values: list) -> Optional[float]:
    v = [x for x in values if x is not None]
    return statistics.median(v) if v else None


def aggregate(row: StudyRow) -> None:
    """The row's figures from its repeats: medians, the tokens/s interval, the worst step spread."""
    runs = [r for r in row.runs if r.get("tokens_per_s") or r.get("loss_curve")]
    row.repeats = len(runs)
    if not runs:
        return
    est = log_interval([r["tokens_per_s"] for r in runs if r.get("tokens_per_s")])
    row.tokens_per_s, row.tokens_per_s_lo, row.tokens_per_s_hi = est.value, est.lo, est.hi
    row.step_ms_p50 = _median([r.get("step_ms_p50") for r in runs])
    row.step_ms_p90 = _median([r.get("step_ms_p90") for r in runs])
    spreads = []
    for r in runs:
        s = r.get("step_ms_spread")
        if s is None and r.get("step_ms_p50") and r.get("step_ms_p90") is not None:
            s = r["step_ms_p90"] / r["step_ms_p50"]
        if s is not None:
            spreads.append(s)
    row.step_spread = max(spreads) if spreads else None
    row.noisy = None if row.step_spread is None else row.step_spread > NOISY_SPREAD
    mems = [r["peak_mem_gib"] for r in runs if r.get("peak_mem_gib") is not None]
    row.peak_mem_gib = max(mems) if mems else None
    row.mfu = _median([r.get("mfu") for r in runs])
    row.warmup_s = _median([r.get("warmup_s") for r in runs])
    row.final_loss = runs[0].get("final_loss")
    row.loss_curve = runs[0].get("loss_curve") or []
    row.probe_curve = runs[0].get("probe_curve") or []
