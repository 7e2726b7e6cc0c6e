"""What compiling buys, compiled against compiled: each whole-model-compiled row's tokens/s and peak
memory over those of the baseline's compiled row at the same point, paired by round.

The report's speedup columns compare every row with the eager baseline and reference; a compiled row
then mixes two effects (its method and the compiler). This table holds the compiler fixed: a method's
compiled run against the baseline's compiled run, so a study that lists both in ``study.compiled``
says what the method buys under compile (e.g. the project's fused attention and loss against cuDNN
attention, both compiled). Only rows that passed are compared; none when the baseline was not compiled.

A compiled row whose configuration declares a loss fallback (``accel.compiled_loss_method``,
harness.fallback: the public stack's Liger loss does not trace under torch.compile) ran another loss
method than its eager row: its label names the method that ran, and ``fallback_lines`` say so in the report.
"""

from __future__ import annotations

from typing import Mapping, Optional

from harness.fallback import fallback_note
from harness.study.labels import own_accel, patched_words
from harness.study.ratios import COMPARED, ratio_cell, set_ratios


def compiled_baseline(rows: list, r, base_name: str) -> Optional[object]:
    """The baseline configuration's compiled row at ``r``'s point (not a spread run, not a twin); None
    for an eager ``r`` or the baseline's compiled row itself."""
    if not r.compiled or r.role:
        return None
    base = next((b for b in rows if b.method == base_name and b.compiled and not b.role and not b.variant
                 and b.point == r.point), None)
    return None if base is r else base


def add_compiled_ratios(rows: list, base_name: str) -> None:
    """vs_compiled_baseline / mem_vs_compiled_baseline (with 95% intervals) of every compiled row over
    the baseline's compiled row, both having passed; the others get none."""
    for r in rows:
        b = compiled_baseline(rows, r, base_name)
        compared = b is not None and r.status in COMPARED and b.status in COMPARED
        set_ratios(r, b if compared else None, "vs_compiled_baseline", "mem_vs_compiled_baseline")


def compiled_lines(rows: list, base_name: str) -> list[str]:
    """The report's table of compiled rows against the baseline's compiled row ([] when there is none)."""
    pairs = [(r, b) for r in rows if (b := compiled_baseline(rows, r, base_name)) is not None]
    if not pairs:
        return []
    lines = ["", f"## Compiled against compiled {base_name}", "",
             f"Each whole-model-compiled row's tokens/s and peak memory divided by those of `{base_name}` compiled "
             "at the same point, paired by round; [lo, hi] is a 95% interval with 3 or more repeats. Only rows that "
             "passed "
             "are compared.", "",
             f"| method | patched | tokens/s | tokens/s vs {base_name} + compile | peak GiB | "
             f"peak memory vs {base_name} + compile |", "|---|---|---|---|---|---|"]
    for r, b in pairs:
        where = f"{r.point}: " if r.point else ""
        tps = "-" if r.tokens_per_s is None else f"{r.tokens_per_s:,.0f}"
        mem = "-" if r.peak_mem_gib is None else f"{r.peak_mem_gib:.2f}"
        speed, memory = ratio_cell(r, "vs_compiled_baseline"), ratio_cell(r, "mem_vs_compiled_baseline")
        if r.vs_compiled_baseline is None and r.mem_vs_compiled_baseline is None:
            speed = memory = f"- ({r.label}: {r.status}; {b.label}: {b.status})"
        lines.append(f"| {where}{r.label} | {patched_words(r.patched) or '-'} | {tps} | {speed} | {mem} | {memory} |")
    return lines


def fallback_lines(rows: list) -> list[str]:
    """The report's note of every row that ran a declared loss fallback ([] when none did)."""
    notes = dict.fromkeys(f"{r.point + ': ' if r.point else ''}`{r.label}`: {r.fallback}" for r in rows if r.fallback)
    return [f"**Loss fallback** (declared by the configuration, harness/fallback.py): {n}." for n in notes]


def recorded_fallback(res: Mapping) -> str:
    """The loss fallback a run's results record (``harness.report``'s rows): its configuration's note, as
    the conf/accel file of that name sets it, where the run's loss method was its compiled_loss_method."""
    a = (res.get("config") or {}).get("accel") or {}
    took = a.get("compiled_loss_method")
    if not res.get("compile_model") or not took or a.get("loss_method") != took:
        return ""
    return fallback_note(dict(a, loss_method=own_accel(str(res.get("method") or "")).get("loss_method")), True)
