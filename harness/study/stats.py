"""Medians and 95% confidence intervals over a study's repeats.

Throughputs and speedups are ratios, so intervals are computed on their logarithms and mapped back
(a t-interval on log values: a speedup of 2x and one of 0.5x are equally far from 1):

* tokens/s of one method: the t-interval of the mean of log(tokens/s) over its repeats;
* a speedup of method A over method B, when both ran in the same rounds (a study runs the methods
  round-robin: A, B, C, A, B, C, ...): the ratios within each round, A_i / B_i, and the t-interval of
  the mean of their logs (paired: a slow drift of the machine cancels within a round);
* otherwise (runs collected by ``harness.report``, or a repeat that crashed): Welch's t-interval of
  the difference of the mean logs (unpaired).

The point estimate is the median over repeats (of the per-round ratios when paired). With fewer than
MIN_INTERVAL_RUNS (3) there is no interval: from two runs the t quantile is 12.7 and the spread rests
on one difference, so the interval spans orders of magnitude (``1,404 [0, 4,703,713]``) and says
nothing; from three (t = 4.3, two degrees of freedom) it is wide but finite information. An
interval that contains 1.0 means the speedup is within the run-to-run noise.
The t quantiles come from a table (no SciPy needed); fractional Welch degrees of freedom are rounded
down, which widens the interval slightly.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Optional, Sequence

# two-sided 95%: t_{0.975, df} for df = 1..30
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042]


def t975(df: float) -> float:
    """The 97.5% quantile of Student's t with ``df`` degrees of freedom (rounded down to an integer)."""
    d = int(math.floor(df))
    if d < 1:
        return math.inf
    if d <= len(_T975):
        return _T975[d - 1]
    return 1.960 + 2.4 / d  # within 0.3% of the exact quantile above 30


#: the fewest runs (or paired rounds) an interval is computed from (see the module docstring)
MIN_INTERVAL_RUNS = 3


@dataclass
class Estimate:
    value: Optional[float]  # the median
    lo: Optional[float] = None  # 95% interval (None: fewer than MIN_INTERVAL_RUNS repeats)
    hi: Optional[float] = None
    n: int = 0

    @property
    def within_noise(self) -> Optional[bool]:
        """For a ratio: whether its interval contains 1.0 (None without an interval)."""
        if self.lo is None or self.hi is None:
            return None
        return self.lo <= 1.0 <= self.hi


def _logs(values: Sequence[float]) -> list[float]:
    return [math.log(v) for v in values if v is not None and v > 0 and math.isfinite(v)]


def log_interval(values: Sequence[float]) -> Estimate:
    """Median and 95% t-interval (on log values) of positive measurements."""
    logs = _logs(values)
    n = len(logs)
    if n == 0:
        return Estimate(None)
    med = statistics.median(v for v in values if v is not None and v > 0 and math.isfinite(v))
    if n < MIN_INTERVAL_RUNS:
        return Estimate(med, n=n)
    mean, sd = statistics.fmean(logs), statistics.stdev(logs)
    half = t975(n - 1) * sd / math.sqrt(n)
    return Estimate(med, math.exp(mean - half), math.exp(mean + half), n)


def ratio_interval(num: Sequence[float], den: Sequence[float], paired: bool) -> Estimate:
    """Median and 95% interval of num / den: per-round ratios when ``paired`` (equal lengths, round i
    with round i), else Welch's interval of exp(mean log num - mean log den)."""
    if paired and len(num) == len(den):
        ratios = [a / b for a, b in zip(num, den) if a and b and a > 0 and b > 0]
        return log_interval(ratios)
    a, b = _logs(num), _logs(den)
    if not a or not b:
        return Estimate(None)
    med = math.exp(statistics.median(a) - statistics.median(b))
    if len(a) < MIN_INTERVAL_RUNS or len(b) < MIN_INTERVAL_RUNS:
        return Estimate(med, n=min(len(a), len(b)))
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    diff = statistics.fmean(a) - statistics.fmean(b)
    if se == 0:
        return Estimate(med, math.exp(diff), math.exp(diff), min(len(a), len(b)))
    df = (va + vb) ** 2 / ((va ** 2 / (len(a) - 1) if va else 0.0) + (vb ** 2 / (len(b) - 1) if vb else 0.0))
    half = t975(df) * se
    return Estimate(med, math.exp(diff - half), math.exp(diff + half), min(len(a), len(b)))


def round_ratio(num: dict, den: dict) -> Estimate:
    """num / den from measurements keyed by round: paired where both hold the same rounds, else unpaired
    (a study's speedups and its loss-kernel ratios, harness.study.judge and harness.study.ratios)."""
    paired = bool(num) and set(num) == set(den)
    if paired:
        rounds = sorted(num)
        return ratio_interval([num[i] for i in rounds], [den[i] for i in rounds], paired=True)
    return ratio_interval(list(num.values()), list(den.values()), paired=False)
