"""What a study's loss kernel adds end to end: each loss-split row's tokens/s and peak memory over those
of its ``: attention`` twin (same method, point and compile setting; harness.study.plan makes the
twins), paired by round with a 95% interval when ``study.repeats`` >= 2 (harness.study.stats). The
report's table "What the loss kernel adds" and results.csv's ``vs_attention`` / ``mem_vs_attention``
columns carry them. ``set_ratios`` is shared with the compiled-against-compiled table
(harness.study.compiled).
"""

from __future__ import annotations

from typing import Optional

from harness.study.labels import ALONE, patched_words
from harness.study.stats import Estimate, round_ratio

#: statuses whose numbers are compared
COMPARED = ("PASS", "REFERENCE")


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


def ratio_cell(r, attr: str) -> str:
    """A table cell of ratio ``attr`` of ``r``: '1.234x', with its interval and "within noise" when it has one."""
    v, lo, hi = getattr(r, attr), getattr(r, attr + "_lo"), getattr(r, attr + "_hi")
    if v is None:
        return "-"
    text = f"{v:.3f}x"
    if lo is not None and hi is not None:
        text += f" [{lo:.3f}, {hi:.3f}]" + (" within noise" if lo <= 1.0 <= hi else "")
    return text + (" UNTRUSTED" if getattr(r, "untrusted", None) and attr.startswith("vs_") else "")


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
        speed, memory = ratio_cell(r, "vs_attention"), ratio_cell(r, "mem_vs_attention")
        if r.vs_attention is None:
            speed = memory = f"- ({r.label}: {r.status}; {t.label}: {t.status})"
        lines.append(f"| {where}{r.label} vs {t.label} | {patched_words(r.patched) or '-'} | {tps} | {speed} | "
                     f"{mem} | {memory} |")
    return lines
