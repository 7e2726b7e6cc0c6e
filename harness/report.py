"""Build a study-style report from any directory of runs: ``python -m harness.report <dir> [--out DIR]``.

It collects every ``results.json`` under the directory (a Hydra multirun sweep, a study, runs copied
from a cluster) with its ``parity_probe.json`` when a study wrote one, and, from any ``study.json``
there, the rows that left no run behind (SKIPPED, OOM, a failed gate). Runs are compared only with
runs whose loss curves can be compared: the same model, data (all but the batch order's seed),
steps, learning-rate schedule, optimizer, precision, world size and seed. Within such a group, runs
of one method are its repeats (medians and intervals, harness.stats), the eager reference run
(``--reference``, default ``torch``) is the one every loss curve is checked against, and a reference
run on another data order (``data.seed``) is the spread run that sets the tolerance (harness.parity);
other runs on another data order are not compared. Runs of one method that asked for different
softmaxes (``accel.patch``, ``accel.loss_form``) are separate rows labelled by them, with the ratios
over the attention-only row (harness.study_split). Crashed and failed jobs appear with their error
and no speedup. Groups that differ only in the sequence length (or only in the model) are the points
of a sweep, with its scaling charts: a sweep split over several studies reads back as one.

The report is written to ``--out``, by default a new directory beside the source
(``<dir>-report-<time>``); nothing in the source directory is created, changed or removed unless
``--out`` points into it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any, Optional

from omegaconf import OmegaConf

from harness.config import StudyConfig
from harness.study_report import StudyRow, add_run, finish, write_outputs
from harness.study_split import mark_split, requested, split_rank

STATUS = {"completed": "PASS", "failed": "FAIL", "crashed": "CRASH", "interrupted": "INTERRUPTED",
          "nonfinite": "FAIL", "running": "CRASH"}
#: what changes a loss curve, beyond the model and the data (trainer keys)
TRAINER_KEYS = ("max_steps", "lr", "min_lr_ratio", "lr_warmup_steps", "weight_decay", "beta1", "beta2", "grad_clip")
#: data keys that do not change the curve (the batch order's seed is handled apart)
DATA_IGNORED = ("cache_dir", "seed")


def collect(root: Path) -> list[dict]:
    found = []
    for path in sorted(Path(root).rglob("results.json")):
        try:
            res = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            found.append({"status": "crashed", "error": f"unreadable {path}: {exc}", "method": path.parent.name,
                          "run_dir": str(path.parent)})
            continue
        res["run_dir"] = str(path.parent)  # where it is now (a copied study keeps its layout)
        probe = path.parent / "parity_probe.json"
        if probe.exists():
            try:
                res["_probe_curve"] = json.loads(probe.read_text()).get("curve") or []
            except (OSError, json.JSONDecodeError):
                pass
        found.append(res)
    return found


def curve_settings(res: dict) -> dict:
    """Everything in a run that changes its loss curve (but the batch order's seed), flattened."""
    cfg = res.get("config") or {}
    out: dict[str, Any] = {}
    for k, v in sorted((res.get("model") or cfg.get("model") or {}).items()):
        if k != "name":
            out[f"model.{k}"] = v
    for k, v in sorted((res.get("data") or cfg.get("data") or {}).items()):
        if k not in DATA_IGNORED:
            out[f"data.{k}"] = v
    trainer = cfg.get("trainer") or {}
    for k in TRAINER_KEYS:
        out[f"trainer.{k}"] = trainer.get(k)
    out["precision"] = res.get("precision") or cfg.get("precision_resolved")
    out["world_size"] = res.get("world_size")
    out["seed"] = res.get("seed", cfg.get("seed"))
    return out


def group_key(res: dict) -> tuple:
    return tuple(sorted((k, json.dumps(v, sort_keys=True)) for k, v in curve_settings(res).items()))


def data_seed(res: dict) -> Optional[int]:
    """The effective seed of the run's batch order."""
    d = res.get("data") or (res.get("config") or {}).get("data") or {}
    s = d.get("seed")
    return res.get("seed", (res.get("config") or {}).get("seed")) if s is None else s


def _round(run_dir: str, fallback: int) -> int:
    """A study's repeat number from its run directory (``.../r3``); else a negative index (unpaired)."""
    m = re.fullmatch(r"r(\d+)", Path(run_dir).name)
    return int(m.group(1)) if m else -fallback


def _row_from(res: dict, role: str = "", point: str = "", seed: Optional[int] = None) -> StudyRow:
    status = STATUS.get(res.get("status", "crashed"), "CRASH")
    row = StudyRow(res.get("method", "?"), bool(res.get("compile_model")), status, exact=res.get("exact", True)
                   is not False, point=point, role=role, data_seed=seed if role else None)
    row.patched = res.get("patched")
    gate = res.get("gate") or {}
    row.judged = ("timing only" if not row.exact else "gate + parity" if gate.get("checked") else
                  f"parity only ({gate['reason']})" if gate.get("reason") else "parity")
    if status != "PASS":
        row.reason = res.get("error") or ("did not finish (its results.json still says running)"
                                          if res.get("status") == "running" else "")
    if status == "INTERRUPTED":
        row.reason = f"interrupted at step {res.get('steps_done')}"
    return row


def _context(settings: dict) -> Optional[int]:
    return settings.get("data.seq_len") or settings.get("model.context")


def _sweep_kind(differing: list[str], groups: dict) -> Optional[str]:
    """'context' when the groups differ only in the sequence length (and the batch), 'model' when only
    in the model's shape (and the batch), as a study's sweeps do; else None."""
    if len(groups) < 2 or not differing:
        return None
    if set(differing) <= {"model.context", "data.seq_len", "data.batch_size"}:
        return "context"
    if all(k.startswith("model.") or k == "data.batch_size" for k in differing):
        names = {(g[0].get("model") or {}).get("name") for g in groups.values()}
        return "model" if len(names) == len(groups) else None
    return None


def _label(settings: dict, differing: list[str]) -> str:
    return ", ".join(f"{k}={settings.get(k)}" for k in differing)


def _study_rows(root: Path) -> list[tuple[Path, dict]]:
    """Rows of any study.json under root that left no run to collect: (study dir, row)."""
    out = []
    for path in sorted(Path(root).rglob("study.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        for r in data.get("rows") or []:
            out.append((path.parent, r))
    return out


def _study_settings(root: Path) -> dict:
    """The parity settings of the first study.json under root (the report's defaults)."""
    for path in sorted(Path(root).rglob("study.json")):
        try:
            return (json.loads(path.read_text()).get("config") or {}).get("study") or {}
        except (OSError, json.JSONDecodeError):
            continue
    return {}


def build_report(root: Path, out: Optional[Path] = None, parity_steps: Optional[int] = None,
                 parity_tol: Optional[float] = None, reference: str = "torch", baseline: str = "naive",
                 parity_k: Optional[float] = None, parity_floor: Optional[float] = None) -> list[StudyRow]:
    root = Path(root)
    runs = collect(root)
    study_rows = _study_rows(root)
    if not runs and not study_rows:
        raise FileNotFoundError(f"no results.json under {root}")
    out = Path(out) if out is not None else default_out(root)
    defaults = StudyConfig()
    saved = _study_settings(root)

    def pick(given, key):
        return given if given is not None else saved.get(key, getattr(defaults, key))

    k, floor = pick(parity_k, "parity_k"), pick(parity_floor, "parity_floor")
    steps, fixed = pick(parity_steps, "parity_steps"), parity_tol if parity_tol is not None else saved.get("parity_tol")

    groups: dict[tuple, list[dict]] = {}
    known = [r for r in runs if r.get("config")]
    for res in known:
        groups.setdefault(group_key(res), []).append(res)
    for res in runs:  # a job that failed before it wrote its config: placed with its siblings
        if res.get("config"):
            continue
        parent = Path(res.get("run_dir", "")).parent
        near = {group_key(r) for r in known if Path(r.get("run_dir", "")).parent == parent}
        key = next(iter(near)) if len(near) == 1 else next(iter(groups)) if len(groups) == 1 else group_key(res)
        groups.setdefault(key, []).append(res)
    settings_of = {key: curve_settings(members[0]) for key, members in groups.items()}
    all_keys = sorted({k_ for s in settings_of.values() for k_ in s})
    differing = [k_ for k_ in all_keys if len({json.dumps(s.get(k_)) for s in settings_of.values()}) > 1]
    sweep = _sweep_kind(differing, groups)
    if sweep == "context":  # groups in order of T, labelled as a study's sweep points
        groups = dict(sorted(groups.items(), key=lambda kv: _context(settings_of[kv[0]])))

    rows: list[StudyRow] = []
    by_run_dir: dict[str, str] = {}  # run dir -> the point (group label) its row went to
    for gi, (key, members) in enumerate(groups.items(), 1):
        st = settings_of[key]
        if sweep == "context":
            label = f"T={_context(st)} batch {st.get('data.batch_size')}"
        elif sweep == "model":
            label = str((members[0].get("model") or {}).get("name"))
        else:
            label = (_label(st, differing) or f"group {gi}") if len(groups) > 1 else ""
        values = {"context": _context(st), "batch_size": st.get("data.batch_size")}
        if sweep == "model":
            values["model"] = label
        ref_seeds = [data_seed(r) for r in members if r.get("method") == reference and not r.get("compile_model")]
        unset = [data_seed(r) for r in members if r.get("method") == reference and not r.get("compile_model")
                 and ((r.get("data") or {}).get("seed") is None)]
        main_seed = (unset or sorted(s for s in ref_seeds if s is not None) or [None])[0]
        keyed: dict[tuple, StudyRow] = {}
        def order(r: dict) -> tuple:  # the reference first (then its spread run), the baseline, compiled last
            return (bool(r.get("compile_model")), r.get("method") != reference, r.get("method") != baseline,
                    r.get("method") or "", split_rank(requested(r)), data_seed(r) != main_seed, r.get("run_dir", ""))

        for i, res in enumerate(sorted(members, key=order), 1):
            seed = data_seed(res)
            other_order = main_seed is not None and seed is not None and seed != main_seed
            is_ref = res.get("method") == reference and not res.get("compile_model")
            role = "spread" if other_order and is_ref else ""
            point = label if not other_order or is_ref else \
                (label + ", " if label else "") + f"data seed {seed} (another data order than the reference)"
            rk = (res.get("method"), bool(res.get("compile_model")), requested(res), role, point)
            row = keyed.get(rk)
            if row is None:
                row = keyed[rk] = _row_from(res, role, point, seed)
                row.point_values, row.patch = dict(values), requested(res)
                rows.append(row)
            elif STATUS.get(res.get("status", "crashed"), "CRASH") != "PASS" and row.status == "PASS":
                row.status, row.reason = _row_from(res).status, _row_from(res).reason
            by_run_dir[str(Path(res["run_dir"]).resolve())] = point
            if res.get("status") in ("completed", "interrupted", "nonfinite") or res.get("tokens_per_s"):
                add_run(row, res, _round(res.get("run_dir", ""), i), res.get("_probe_curve"))
    _add_study_rows(rows, study_rows, by_run_dir, runs)
    mark_split(rows)  # a configuration run with different accel.patch / loss_form: one row each, labelled

    first = runs[0] if runs else {}
    model = first.get("model") or {}
    cfg = OmegaConf.create({
        "model": {k_: model.get(k_, "?") for k_ in ("name", "n_layer", "n_embd", "n_head", "context", "vocab_size")},
        "data": {k_: (first.get("data") or {}).get(k_, "?") for k_ in ("name", "batch_size", "seq_len")},
        "trainer": {"max_steps": max([int(((r.get("config") or {}).get("trainer") or {}).get("max_steps") or 0)
                                      for r in runs] or [0]) or "?",
                    "warmup_steps": ((first.get("config") or {}).get("trainer") or {}).get("warmup_steps", "?")},
        "seed": first.get("seed", "?"),
        "study": {"parity_steps": steps, "parity_tol": fixed, "parity_k": k, "parity_floor": floor,
                  "reference": reference, "baseline": baseline, "sweep": sweep},
    })
    settings = finish(rows, cfg)
    notes = [f"Collected from `{root}`: {len(runs)} runs in {len(groups)} group(s) of comparable runs"
             + (f" (they differ in {', '.join(differing)})" if differing else "") + "."]
    write_outputs(rows, cfg, out, partial=False, settings=settings, title="Report", notes=notes, round_robin=False)
    return rows


def _add_study_rows(rows: list[StudyRow], study_rows: list, by_run_dir: dict, runs: list) -> None:
    """Rows a study recorded without a run to collect (SKIPPED, OOM, a failed gate, a crash before
    training), placed with the runs of the same study and point."""
    for study_dir, r in study_rows:
        dirs = [str((Path(run["run_dir"])).resolve()) for run in r.get("runs") or [] if run.get("run_dir")]
        if any(d in by_run_dir for d in dirs):
            continue  # its runs were collected
        same_point = [d for sd, other in study_rows if sd == study_dir and other.get("point") == r.get("point")
                      for d in [str(Path(run["run_dir"]).resolve()) for run in other.get("runs") or []
                                if run.get("run_dir")] if d in by_run_dir]
        point = by_run_dir[same_point[0]] if same_point else (r.get("point") or str(study_dir))
        row = StudyRow(r.get("method", "?"), bool(r.get("compiled")), r.get("status") or "CRASH",
                       reason=r.get("reason") or "", exact=r.get("exact", True) is not False, point=point,
                       role=r.get("role") or "", data_seed=r.get("data_seed"), variant=r.get("variant") or "",
                       patch=r.get("patch") or "")
        row.point_values = dict(r.get("point_values") or {})
        if row.status not in ("SKIPPED", "OOM", "FAIL", "CRASH"):
            row.status, row.reason = "CRASH", row.reason or "recorded by the study, but its run is missing here"
        rows.append(row)


def default_out(root: Path) -> Path:
    """A new directory beside ``root``: ``<root>-report-<time>`` (never inside the source)."""
    root = Path(root).resolve()
    base = root.parent / f"{root.name}-report-{time.strftime('%Y%m%d-%H%M%S')}"
    out, i = base, 1
    while out.exists():
        i += 1
        out = Path(f"{base}-{i}")
    return out


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m harness.report", description=__doc__.split("\n\n")[0])
    p.add_argument("root", type=Path, help="a directory holding runs (results.json files), e.g. a sweep dir")
    p.add_argument("--out", type=Path, default=None,
                   help="where to write the report (default: a new <root>-report-<time> beside root)")
    p.add_argument("--parity-steps", type=int, default=None, help="the parity window (default: the whole run)")
    p.add_argument("--parity-tol", type=float, default=None,
                   help="a fixed relative tolerance (default: derived from a spread run, else the floor)")
    p.add_argument("--parity-k", type=float, default=None, help="tolerance = max(floor, k x spread) (default 3)")
    p.add_argument("--parity-floor", type=float, default=None, help="the smallest tolerance (default 0.005)")
    p.add_argument("--reference", default="torch", help="the run every loss curve is compared with (default: torch)")
    p.add_argument("--baseline", default="naive", help="the run speedups are given against (default: naive)")
    a = p.parse_args(argv)
    if not a.root.is_dir():
        p.error(f"{a.root} is not a directory")
    out = a.out if a.out is not None else default_out(a.root)
    try:
        build_report(a.root, out, a.parity_steps, a.parity_tol, a.reference, a.baseline, a.parity_k, a.parity_floor)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    print((out / "report.md").read_text())
    print(f"report: wrote report.md, results.csv, runs.csv, study.json and charts to {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
