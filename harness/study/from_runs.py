"""The report over any directory of runs (``python -m harness.report <dir>``, harness.report), as a
study writes its own.

It collects every ``results.json`` under the directory (a Hydra multirun sweep, a study, runs copied
from a cluster) with its ``parity_probe.json`` when a study wrote one, and, from any ``study.json``
there, the rows that left no run behind (SKIPPED, OOM, a failed gate), matched with the runs by where
they ran (a study moved elsewhere reads back whole). Runs are compared only with
runs whose loss curves can be compared: the same model, data (all but the batch order's seed),
steps, learning-rate schedule, optimizer, precision, world size and seed. Within such a group, runs
of one method are its repeats (medians and intervals, harness.study.stats), the eager reference run
(``--reference``, default the study's ``study.reference``, else ``torch``; the baseline and parity
settings likewise) is the one every loss curve is checked against, and a reference
run on another data order (``data.seed``) is the spread run that sets the tolerance (harness.study.parity);
other runs on another data order are not compared. Runs of one method that asked for different
softmaxes (``accel.patch``, ``accel.loss_form``) are separate rows labelled by them, with the ratios
over the attention-only row (harness.study.ratios). Crashed and failed jobs appear with their error
and no speedup. Groups that differ only in the sequence length (or only in the model) are the points
of a sweep, with its scaling charts: a sweep split over several studies reads back as one. The
header names the environment the runs recorded, and an incomplete study says how far it got.

The report is written to ``--out``, by default a new directory beside the source
(``<dir>-report-<time>``); nothing in the source directory is created, changed or removed unless
``--out`` points into it. Reading and grouping the runs: harness.study.collect.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig, OmegaConf

from harness.config import StudyConfig
from harness.study.collect import (UNPLACED, Groups, collect, comparable_groups, context_of, data_seed,
                                   runs_environment, study_files, study_rows, study_settings)
from harness.study.compiled import recorded_fallback
from harness.study.groups import SETTINGS_ANCHOR, SETTINGS_HEADING, settings_lines, short_labels
from harness.study.judge import finish
from harness.study.labels import configured, mark_split, own_setting, own_words, requested, split_rank
from harness.study.progress import progress_line, saved_progress
from harness.study.report import write_outputs
from harness.study.rows import StudyRow, add_run

STATUS = {"completed": "PASS", "failed": "FAIL", "crashed": "CRASH", "interrupted": "INTERRUPTED",
          "nonfinite": "FAIL", "running": "CRASH", "oom": "OOM"}


def build_report(root: Path, out: Optional[Path] = None, parity_steps: Optional[int] = None,
                 parity_tol: Optional[float] = None, reference: Optional[str] = None,
                 baseline: Optional[str] = None, parity_k: Optional[float] = None,
                 parity_floor: Optional[float] = None, charts: bool = True) -> list[StudyRow]:
    """The report over ``root``. A setting left None is the study's (its study.json, or the Hydra config
    saved with it), else the study's default (harness.config.StudyConfig); ``charts``: draw them."""
    root = Path(root)
    runs = collect(root)
    studies = study_files(root)
    recorded = study_rows(studies)
    if not runs and not recorded:
        raise FileNotFoundError(f"no results.json under {root}")
    out = Path(out) if out is not None else default_out(root)
    saved = study_settings(root, studies)
    study = _study_keys(saved, parity_steps=parity_steps, parity_tol=parity_tol, parity_k=parity_k,
                        parity_floor=parity_floor, reference=reference, baseline=baseline)
    found = comparable_groups(runs)
    rows, by_run_dir = _rows_of_groups(found, study["reference"], study["baseline"])
    _add_study_rows(rows, recorded, by_run_dir, runs)
    mark_split(rows)  # a configuration run with different accel.patch / loss_form: one row each, labelled
    cfg = _report_cfg(runs, dict(study, sweep=found.sweep))
    settings = finish(rows, cfg)
    notes, states = _notes(root, runs, found, saved, studies, study)
    table = settings_lines(found.settings, found.differing, short_labels(found.settings, found.differing))
    write_outputs(rows, cfg, out, partial=False, settings=settings, title="Report", notes=notes, round_robin=False,
                  env=runs_environment(runs, studies), progress=states[0][1] if len(states) == 1 else None,
                  charts=charts, appendix=table,
                  point_note=f"Settings: [{SETTINGS_HEADING}](#{SETTINGS_ANCHOR})." if table else "")
    return rows


def _study_keys(saved: dict, **given) -> dict:
    """The study keys the report judges by: each as given, else as the study saved it, else the study's
    default (the fixed parity tolerance: as given or saved, else none)."""
    defaults = StudyConfig()

    def pick(key):
        return given[key] if given[key] is not None else saved[key] if saved.get(key) is not None \
            else getattr(defaults, key)

    fixed = given["parity_tol"] if given["parity_tol"] is not None else saved.get("parity_tol")
    return {"parity_steps": pick("parity_steps"), "parity_tol": fixed, "parity_k": pick("parity_k"),
            "parity_floor": pick("parity_floor"), "reference": pick("reference"), "baseline": pick("baseline")}


def _rows_of_groups(found: Groups, reference: str, baseline: str) -> tuple[list[StudyRow], dict[str, str]]:
    """The rows of every group (a group is a point of the report), each run added to its row as a
    repeat; and where each run's row went (run dir -> point)."""
    rows: list[StudyRow] = []
    by_run_dir: dict[str, str] = {}  # run dir -> the point (group label) its row went to
    labels = short_labels(found.settings, found.differing)
    for key, members in found.members.items():
        st = found.settings[key]
        if found.sweep == "context" and key != UNPLACED:
            label = f"T={context_of(st)} batch {st.get('data.batch_size')}"
        elif found.sweep == "model" and key != UNPLACED:
            label = str((members[0].get("model") or {}).get("name"))
        else:
            label = labels[key] if len(found.members) > 1 else ""
        values = {"context": context_of(st), "batch_size": st.get("data.batch_size")}
        if found.sweep == "model":
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
                row.fallback = recorded_fallback(res)
                rows.append(row)
            elif STATUS.get(res.get("status", "crashed"), "CRASH") != "PASS" and row.status == "PASS":
                row.status, row.reason = _row_from(res).status, _row_from(res).reason
            for d in (res["run_dir"], res.get("_recorded_run_dir")):  # where it is, and where it ran
                if d:
                    by_run_dir[str(Path(d).resolve())] = point
            if res.get("status") in ("completed", "interrupted", "nonfinite") or res.get("tokens_per_s"):
                add_run(row, res, _round(res.get("run_dir", ""), i), res.get("_probe_curve"))
    return rows, by_run_dir


def _report_cfg(runs: list[dict], study: dict) -> DictConfig:
    """What the report says of the runs' model, data and trainer (from the first run), and the study
    keys it judged them by."""
    first = runs[0] if runs else {}
    model = first.get("model") or {}
    cfg = OmegaConf.create({
        "model": {k_: model.get(k_, "?") for k_ in ("name", "n_layer", "n_embd", "n_head", "context", "vocab_size")},
        "data": {k_: (first.get("data") or {}).get(k_, "?") for k_ in ("name", "batch_size", "seq_len")},
        "trainer": {"max_steps": max([int(((r.get("config") or {}).get("trainer") or {}).get("max_steps") or 0)
                                      for r in runs] or [0]) or "?",
                    "warmup_steps": ((first.get("config") or {}).get("trainer") or {}).get("warmup_steps", "?")},
        "seed": first.get("seed", "?"),
        "study": study,
    })
    return cfg


def _notes(root: Path, runs: list[dict], found: Groups, saved: dict, studies: list,
           study: dict) -> tuple[list, list]:
    """The report's notes (where the runs came from, whose reference and baseline, how far an
    incomplete study got) and the incomplete studies' progress: (study dir, progress)."""
    groups, differing = found.members, found.differing
    reference, baseline = study["reference"], study["baseline"]
    notes = [f"Collected from `{root}`: {len(runs)} runs in {len(groups)} group(s) of comparable runs"
             + (f" (they differ in {', '.join(differing)})" if differing else "") + "."]
    if saved.get("reference") is not None or saved.get("baseline") is not None:
        notes.append(f"Reference `{reference}` and baseline `{baseline}`: the study's own settings "
                     "(--reference / --baseline override them).")
    states = [(d, p) for d, data in studies if (p := saved_progress(data)) and not p.get("complete")]
    for d, state in states:
        line = progress_line(state)
        notes.append(line if len(studies) == 1 else f"`{d.relative_to(root) if d != root else '.'}`: {line}")
    return notes, states


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


def _main_seed(members: list[dict], reference: str) -> Optional[int]:
    """The batch order every run of a group is compared on: the reference's (one that leaves data.seed
    unset first, as a study's main run does); without a reference run, that of the runs leaving it unset."""
    ref = [r for r in members if r.get("method") == reference and not r.get("compile_model")]
    for pool in (ref, members):
        unset = [data_seed(r) for r in pool if (r.get("data") or {}).get("seed") is None and data_seed(r) is not None]
        if unset:
            return unset[0]
    return (sorted(s for s in (data_seed(r) for r in ref) if s is not None) or [None])[0]


def _add_study_rows(rows: list[StudyRow], recorded: list, by_run_dir: dict, runs: list) -> None:
    """Rows a study recorded without a run to collect (SKIPPED, OOM, a failed gate, a crash before
    training), placed with the runs of the same study and point."""
    def found(study_dir: Path, row: dict) -> list[str]:
        return [d for run in row.get("runs") or [] if run.get("run_dir")
                for d in [_located(run["run_dir"], study_dir, by_run_dir)] if d]

    for study_dir, r in recorded:
        if found(study_dir, r):
            continue  # its runs were collected
        same_point = [d for sd, other in recorded if sd == study_dir and other.get("point") == r.get("point")
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
