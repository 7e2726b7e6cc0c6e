"""Build a study-style report from any directory of runs: ``python -m harness.report <dir> [--out DIR]``.

It collects every ``results.json`` under the directory (a Hydra multirun sweep, a study, runs copied
from a cluster) with its ``parity_probe.json`` when a study wrote one, and, from any ``study.json``
there, the rows that left no run behind (SKIPPED, OOM, a failed gate), matched with the runs by where
they ran (a study moved elsewhere reads back whole). Runs are compared only with
runs whose loss curves can be compared: the same model, data (all but the batch order's seed),
steps, learning-rate schedule, optimizer, precision, world size and seed. Within such a group, runs
of one method are its repeats (medians and intervals, harness.stats), the eager reference run
(``--reference``, default the study's ``study.reference``, else ``torch``; the baseline and parity
settings likewise) is the one every loss curve is checked against, and a reference
run on another data order (``data.seed``) is the spread run that sets the tolerance (harness.parity);
other runs on another data order are not compared. Runs of one method that asked for different
softmaxes (``accel.patch``, ``accel.loss_form``) are separate rows labelled by them, with the ratios
over the attention-only row (harness.study_split). Crashed and failed jobs appear with their error
and no speedup. Groups that differ only in the sequence length (or only in the model) are the points
of a sweep, with its scaling charts: a sweep split over several studies reads back as one. The
header names the environment the runs recorded, and an incomplete study says how far it got.

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
from harness.study_progress import progress_line, saved_progress
from harness.study_judge import finish
from harness.study_report import StudyRow, add_run, write_outputs
from harness.study_split import configured, mark_split, own_setting, own_words, requested, split_rank

STATUS = {"completed": "PASS", "failed": "FAIL", "crashed": "CRASH", "interrupted": "INTERRUPTED",
          "nonfinite": "FAIL", "running": "CRASH", "oom": "OOM"}
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
        res["_recorded_run_dir"] = res.get("run_dir")  # where it ran (a study.json row names it so)
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
    out["world_size"] = res.get("world_size") or _planned_world_size(cfg)
    out["seed"] = res.get("seed", cfg.get("seed"))
    return out


def _planned_world_size(cfg: dict) -> Optional[int]:
    """The processes a run was configured for (devices x nodes, where both are numbers): the world size
    of a run that stopped before it recorded its own (an OOM, a crash before training)."""
    t = cfg.get("trainer") or {}
    devices, nodes = t.get("devices"), t.get("num_nodes", 1)
    return devices * nodes if isinstance(devices, int) and isinstance(nodes, int) else None


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


def _study_files(root: Path) -> list[tuple[Path, dict]]:
    """Every readable study.json under root: (its directory, its contents)."""
    out = []
    for path in sorted(Path(root).rglob("study.json")):
        try:
            out.append((path.parent, json.loads(path.read_text())))
        except (OSError, json.JSONDecodeError):
            continue
    return out


def _study_rows(studies: list[tuple[Path, dict]]) -> list[tuple[Path, dict]]:
    """Every row of the studies: (study dir, row)."""
    return [(d, r) for d, data in studies for r in data.get("rows") or []]


def _study_settings(root: Path, studies: list[tuple[Path, dict]]) -> dict:
    """The study keys (reference, baseline, parity settings) of the first study under root: its study.json,
    else the ``study`` of a Hydra config saved beside runs (``.hydra/config.yaml``); {} when none."""
    for _, data in studies:
        if (data.get("config") or {}).get("study"):
            return data["config"]["study"]
    for path in sorted(Path(root).rglob(".hydra/config.yaml")):
        try:
            study = OmegaConf.to_container(OmegaConf.load(path)).get("study")
        except Exception:  # an unreadable config: no settings from it
            continue
        if isinstance(study, dict):
            return study
    return {}


#: the environment keys the report's header names
ENV_KEYS = ("device_name", "torch", "triton", "git_revision")


def runs_environment(runs: list[dict], studies: list[tuple[Path, dict]]) -> dict:
    """The environment the runs ran in (each results.json records it), not this machine's: a value the
    runs disagree on lists each ('NVIDIA H200 / NVIDIA A100'); from the studies' study.json where no
    run recorded one; 'not recorded' where neither did."""
    envs = [r.get("env") or (r.get("config") or {}).get("env") for r in runs]
    envs = [e for e in envs if isinstance(e, dict)] or [d["env"] for _, d in studies if isinstance(d.get("env"), dict)]
    out: dict[str, Any] = {k: "not recorded" for k in ENV_KEYS}
    for key in dict.fromkeys(k for e in envs for k in e):
        values = list(dict.fromkeys(json.dumps(e[key]) for e in envs if e.get(key) is not None))
        if values:
            out[key] = json.loads(values[0]) if len(values) == 1 else " / ".join(str(json.loads(v)) for v in values)
    return out


def build_report(root: Path, out: Optional[Path] = None, parity_steps: Optional[int] = None,
                 parity_tol: Optional[float] = None, reference: Optional[str] = None,
                 baseline: Optional[str] = None, parity_k: Optional[float] = None,
                 parity_floor: Optional[float] = None) -> list[StudyRow]:
    """The report over ``root``. A setting left None is the study's (its study.json, or the Hydra config
    saved with it), else the study's default (harness.config.StudyConfig)."""
    root = Path(root)
    runs = collect(root)
    studies = _study_files(root)
    study_rows = _study_rows(studies)
    if not runs and not study_rows:
        raise FileNotFoundError(f"no results.json under {root}")
    out = Path(out) if out is not None else default_out(root)
    defaults = StudyConfig()
    saved = _study_settings(root, studies)

    def pick(given, key):
        return given if given is not None else saved[key] if saved.get(key) is not None else getattr(defaults, key)

    k, floor = pick(parity_k, "parity_k"), pick(parity_floor, "parity_floor")
    reference, baseline = pick(reference, "reference"), pick(baseline, "baseline")
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
        main_seed = _main_seed(members, reference)
        keyed: dict[tuple, StudyRow] = {}
        def order(r: dict) -> tuple:  # the reference first (then its spread run), the baseline, compiled last
            name = r.get("method") or ""
            return (bool(r.get("compile_model")), name != reference, name != baseline, name,
                    split_rank(requested(r), own_words(name)), data_seed(r) != main_seed, r.get("run_dir", ""))

        for i, res in enumerate(sorted(members, key=order), 1):
            seed = data_seed(res)
            other_order = main_seed is not None and seed is not None and seed != main_seed
            is_ref = res.get("method") == reference and not res.get("compile_model")
            role = "spread" if other_order and is_ref else ""
            point = label if not other_order or is_ref else \
                (label + ", " if label else "") + f"data seed {seed} (another data order than the reference)"
            rk = (res.get("method"), bool(res.get("compile_model")), requested(res), configured(res), role, point)
            row = keyed.get(rk)
            if row is None:
                row = keyed[rk] = _row_from(res, role, point, seed)
                row.point_values, row.patch = dict(values), requested(res)
                if configured(res) != own_setting(res.get("method") or ""):  # set on the command line
                    row.setting = configured(res)
                rows.append(row)
            elif STATUS.get(res.get("status", "crashed"), "CRASH") != "PASS" and row.status == "PASS":
                row.status, row.reason = _row_from(res).status, _row_from(res).reason
            for d in (res["run_dir"], res.get("_recorded_run_dir")):  # where it is, and where it ran
                if d:
                    by_run_dir[str(Path(d).resolve())] = point
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
    if saved.get("reference") is not None or saved.get("baseline") is not None:
        notes.append(f"Reference `{reference}` and baseline `{baseline}`: the study's own settings "
                     "(--reference / --baseline override them).")
    states = [(d, p) for d, data in studies if (p := saved_progress(data)) and not p.get("complete")]
    for d, state in states:
        line = progress_line(state)
        notes.append(line if len(studies) == 1 else f"`{d.relative_to(root) if d != root else '.'}`: {line}")
    write_outputs(rows, cfg, out, partial=False, settings=settings, title="Report", notes=notes, round_robin=False,
                  env=runs_environment(runs, studies), progress=states[0][1] if len(states) == 1 else None)
    return rows


def _main_seed(members: list[dict], reference: str) -> Optional[int]:
    """The batch order every run of a group is compared on: the reference's (one that leaves data.seed
    unset first, as a study's main run does); without a reference run, that of the runs leaving it unset."""
    ref = [r for r in members if r.get("method") == reference and not r.get("compile_model")]
    for pool in (ref, members):
        unset = [data_seed(r) for r in pool if (r.get("data") or {}).get("seed") is None and data_seed(r) is not None]
        if unset:
            return unset[0]
    return (sorted(s for s in (data_seed(r) for r in ref) if s is not None) or [None])[0]


def _add_study_rows(rows: list[StudyRow], study_rows: list, by_run_dir: dict, runs: list) -> None:
    """Rows a study recorded without a run to collect (SKIPPED, OOM, a failed gate, a crash before
    training), placed with the runs of the same study and point."""
    def found(study_dir: Path, row: dict) -> list[str]:
        return [d for run in row.get("runs") or [] if run.get("run_dir")
                for d in [_located(run["run_dir"], study_dir, by_run_dir)] if d]

    for study_dir, r in study_rows:
        if found(study_dir, r):
            continue  # its runs were collected
        same_point = [d for sd, other in study_rows if sd == study_dir and other.get("point") == r.get("point")
                      for d in found(sd, other)]
        point = by_run_dir[same_point[0]] if same_point else (r.get("point") or str(study_dir))
        row = StudyRow(r.get("method", "?"), bool(r.get("compiled")), r.get("status") or "CRASH",
                       reason=r.get("reason") or "", exact=r.get("exact", True) is not False, point=point,
                       role=r.get("role") or "", data_seed=r.get("data_seed"), variant=r.get("variant") or "",
                       patch=r.get("patch") or "")
        row.point_values = dict(r.get("point_values") or {})
        if row.status not in ("SKIPPED", "OOM", "FAIL", "CRASH"):
            row.status, row.reason = "CRASH", row.reason or "recorded by the study, but its run is missing here"
        twin = next((x for x in rows if not x.runs and (x.method, x.compiled, x.point, x.role) ==
                     (row.method, row.compiled, row.point, row.role) and (not row.patch or x.patch == row.patch)), None)
        if twin is not None:  # its run was collected without numbers (it stopped): the study's verdict wins
            twin.status, twin.reason = row.status, row.reason or twin.reason
            continue
        rows.append(row)


def _located(recorded: str, study_dir: Path, by_run_dir: dict) -> Optional[str]:
    """The collected run a study.json row's run dir names: the same path (as the run recorded it, or as
    it is now), else the same path below the study's directory now (a study copied or moved elsewhere:
    ``/old/place/study/runs/T512/torch`` is ``<study dir>/runs/T512/torch``); None if not collected."""
    parts = Path(recorded).parts
    for cand in [Path(recorded)] + [study_dir.joinpath(*parts[i:]) for i in range(1, len(parts))]:
        key = str(cand.resolve())
        if key in by_run_dir:
            return key
    return None


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
    p.add_argument("--reference", default=None,
                   help="the run every loss curve is compared with (default: the study's study.reference, else torch)")
    p.add_argument("--baseline", default=None,
                   help="the run speedups are given against (default: the study's study.baseline, else naive)")
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
