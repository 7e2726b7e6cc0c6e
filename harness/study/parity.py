"""Loss parity: does a method train the model the way the reference does?

Per-step training losses are a poor yardstick: each step's loss is measured on a different batch, so
two correct runs whose batches differ (a different data order) differ step by step by the batch-to-
batch noise, which on small batches is larger than the gap a wrong method opens. So parity is
measured on a **probe**: a few fixed held-out batches (the corpus' validation split, drawn from the
run's seed, identical in every run of a study), evaluated before the first step and every ``every``
steps at the end of a throughput window (never inside a timed window: the next window syncs the
device before it opens).

The tolerance comes from the reference itself: the study trains the reference twice, with the same
initialization and different data orders (``data.seed``); their **spread** at probe step s is the
largest relative difference of their probe losses at any probe point up to s (it starts at 0: same
weights, no data seen yet, and grows as the two data orders pull the models apart). A correct method
trains on the same batches as the reference and differs from it only by rounding, which moves its
trajectory far less than a new data order does; a wrong method computes a different function from
step 0 on. A method passes when at every probe point s of the window its relative difference from
the reference is at most ``tol(s) = max(floor, k * spread(s))`` (:func:`judge`): the comparison is
sharpest early, where a wrong forward shows at once and the reference's own spread is smallest.

The probe itself (the held-out batches and the Lightning callback) is in harness.probe; this module
is the rule, on recorded curves, with no torch in it (the report and the config checks import it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence


def _points(curve: Sequence, steps: int) -> dict[int, float]:
    return {int(s): float(v) for s, v in curve if int(s) <= steps}


def rel_diffs(curve: Sequence, ref: Sequence, steps: int) -> dict[int, float]:
    """step -> |curve - ref| / |ref| at the probe points both have at steps <= ``steps`` (a
    non-finite loss in ``curve`` is an infinite difference)."""
    a, b = _points(curve, steps), _points(ref, steps)
    out = {}
    for s in sorted(set(a) & set(b)):
        out[s] = abs(a[s] - b[s]) / max(abs(b[s]), 1e-12) if math.isfinite(a[s]) else math.inf
    return out


def envelope(spread_curve: Optional[Sequence], ref: Sequence, steps: int) -> dict[int, float]:
    """step -> the reference's spread up to that step: the largest relative difference between the
    two reference runs at any probe point at or before it (non-decreasing)."""
    if not spread_curve:
        return {}
    out, worst = {}, 0.0
    for s, d in rel_diffs(spread_curve, ref, steps).items():
        worst = max(worst, d)
        out[s] = worst
    return out


@dataclass
class Verdict:
    passed: bool
    dev: float  # the method's relative difference from the reference at its worst point
    tol: float  # the tolerance at that point
    step: Optional[int]  # the worst point (largest dev / tol)
    points: int  # probe points compared
    spread: Optional[float] = None  # the reference's spread over the whole window (None: no spread run)
    reason: str = ""

    @property
    def margin(self) -> float:
        """dev / tol at the worst point: <= 1 passes."""
        return self.dev / self.tol if self.tol else math.inf


def tolerance_at(step: int, env: dict[int, float], k: float, floor: float, fixed: Optional[float]) -> float:
    """The tolerance at a probe step: ``fixed`` when given, else max(floor, k * the spread up to it)."""
    if fixed is not None:
        return float(fixed)
    below = [v for s, v in env.items() if s <= step]
    return max(float(floor), float(k) * (max(below) if below else 0.0))


def judge(curve: Sequence, ref: Sequence, steps: int, k: float, floor: float,
          spread_curve: Optional[Sequence] = None, fixed: Optional[float] = None) -> Verdict:
    """PASS when, at every probe point s of the window, the method's probe loss is within
    tol(s) = max(floor, k * spread(s)) of the reference's (relative), spread(s) being the largest
    difference between the two reference runs up to s (``fixed``: one tolerance everywhere). A
    non-finite loss or no common point is a FAIL."""
    env = envelope(spread_curve, ref, steps)
    spread = max(env.values()) if env else None
    diffs = rel_diffs(curve, ref, steps)
    if not diffs:
        return Verdict(False, math.nan, math.nan, None, 0, spread, "no probe losses to compare with the reference's")
    worst_step, worst = None, -1.0
    for s, d in diffs.items():
        tol = tolerance_at(s, env, k, floor, fixed)
        m = d / tol if tol else math.inf
        if m > worst:
            worst_step, worst = s, m
    dev, tol = diffs[worst_step], tolerance_at(worst_step, env, k, floor, fixed)
    v = Verdict(dev <= tol, dev, tol, worst_step, len(diffs), spread)
    if not math.isfinite(dev):
        v.reason = f"non-finite probe loss at step {worst_step}"
    elif not v.passed:
        if fixed is not None:
            rule = "fixed"
        else:
            here = max([e for s, e in env.items() if s <= worst_step], default=0.0)
            rule = f"max({floor:.2%}, {k:g} x the reference's spread up to there, {here:.2%})"
        v.reason = (f"probe loss departs from the reference's by {dev:.2%} at step {worst_step} (tolerance there "
                    f"{tol:.2%}: {rule})")
    return v
