"""How far a study got, and its report as it stands: a study writes its whole report (parity, speedups,
CSVs, study.json; the charts at the end of each sweep point) after every run, so that one stopped by a
time limit, a kill or Ctrl+C leaves the report of what it finished. The report says when it is
incomplete ("written after point 2 of 6 ..."), and ``study.json`` records the same under ``progress``;
``harness.report`` repeats it, or works it out from the sweep's planned points for a study.json
written before ``progress`` existed.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig

from harness.study.judge import finish
from harness.study.report import write_outputs


def progress(labels: list[str], done: int, running: Optional[str] = None, stopped: str = "") -> dict:
    """Where a study stands: ``done`` of its points ``labels`` finished; ``running`` the point under way
    (its finished runs are in the report); ``stopped`` why it stopped early, a clause ('' while it runs
    or when it finished)."""
    return {"points": list(labels), "done": int(done), "complete": done >= len(labels) and not stopped,
            "running": running, "stopped": stopped}


def progress_line(p: Optional[dict]) -> str:
    """The report's sentence for an incomplete study ('' when it is complete, or nothing is known)."""
    if not p or p.get("complete"):
        return ""
    labels, done = list(p.get("points") or [""]), int(p.get("done") or 0)
    total = len(labels)
    if p.get("stopped"):
        head = f"**Incomplete**: {p['stopped']}"
    else:
        head = "**Incomplete**: written while the study ran (if it was killed, it stopped here)"
    if labels == [""]:  # no sweep
        return f"{head}; the rows are the runs that had finished."
    parts = [f"{head}; {done} of {total} point{'s' if total != 1 else ''} finished"
             + (f", the last {labels[done - 1]}" if done else "")]
    running = p.get("running")
    if running is not None:
        parts.append(f"point {done + 1} ({running}) was under way: its rows are the runs that had finished")
    rest = labels[done + (1 if running is not None else 0):]
    if rest:
        parts.append("not reached: " + ", ".join(rest))
    return "; ".join(parts) + "."


def write_snapshot(rows: list, cfg: DictConfig, out: Path, state: dict, charts: bool) -> None:
    """The study's report as it stands, parity and speedups included, judged on copies of the rows (the
    study goes on with its own, undecided). ``charts``: also draw the charts (at the end of a point)."""
    snap = copy.deepcopy(rows)
    settings = finish(snap, cfg)
    write_outputs(snap, cfg, out, partial=not state.get("complete"), settings=settings,
                  notes=tuple(n for n in [progress_line(state)] if n), charts=charts, progress=state)


def planned_labels(study: dict) -> list[str]:
    """The points a study's config asks for, as (context or model) values: [] outside a sweep."""
    if study.get("sweep") == "context":
        return [str(c) for c in study.get("contexts") or []]
    if study.get("sweep") == "model":
        return [str(m) for m in study.get("models") or []]
    return []


def saved_progress(data: dict) -> Optional[dict]:
    """A study.json's progress: as recorded, or (a study.json from before it was recorded) the sweep's
    planned points against those its rows reach. None when nothing says it is incomplete."""
    if data.get("progress"):
        return data["progress"]
    study = (data.get("config") or {}).get("study") or {}
    planned = planned_labels(study)
    if not planned:
        return None
    key = "context" if study.get("sweep") == "context" else "model"
    count: dict[str, int] = {}
    for r in data.get("rows") or []:
        v = str((r.get("point_values") or {}).get(key))
        count[v] = count.get(v, 0) + 1
    reached = [p for p in planned if p in count]
    name = (lambda v: f"T={v}") if key == "context" else str
    running = None
    if reached and len(reached) < len(planned) and count[reached[-1]] < max(count.values()):
        running = name(reached.pop())  # the last point it reached has fewer rows than the others: cut short
    if len(reached) == len(planned):
        return None
    rest = [p for p in planned if p not in reached]
    return {"points": [name(p) for p in reached + rest], "done": len(reached), "complete": False,
            "running": running, "stopped": "its study.json ends here (the study was killed, or is still running)"}
