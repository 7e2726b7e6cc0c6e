"""Running a study: every planned row (harness.study.plan) at every sweep point, round-robin over the
repeats, each run trained by harness.train behind the kernel gate with a parity probe attached, its
failures recorded (harness.study.failures), the report rewritten after every run (harness.study.progress)
and written whole at the end (harness.study.report).

``run_study`` reads as its steps: check the config, open the study's directory, run each point, report.
"""

from __future__ import annotations

import copy
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig, open_dict
from rich.console import Console
from rich.markup import escape

import kernels
from harness.build import seq_len
from harness.config import accel_methods
from harness.data import data_vocab_size, make_corpus
from harness.probe import ParityProbe, probe_batches
from harness.outcomes import Interrupted
from harness.results import write_json
from harness.study.checks import validate_study
from harness.study.drift import calibrate, calibration_device
from harness.study.failures import finish_wandb, free_memory, record_failure
from harness.study.judge import finish
from harness.study.labels import configured
from harness.study.plan import (Planned, Point, accel_for, fallback, study_plan, sweep_points, unavailable,
                                 with_study_vocab)
from harness.study.profile import profile_on, profile_row
from harness.study.progress import progress, progress_line, write_snapshot
from harness.study.report import log_to_wandb, write_outputs
from harness.study.rows import NO_NUMBERS, StudyRow, add_run
from harness.training import run_training


@dataclass
class StudyRun:
    """One study under way: what it runs, where, and how far it got."""

    cfg: DictConfig
    out: Path  # the study's directory
    group: str  # its runs' W&B group
    console: Console
    points: list[Point]
    order: list[tuple[Planned, str]]  # one round: (planned row, role), the spread run after the reference
    spread_seed: Optional[int]  # the spread run's data order (None: a fixed parity tolerance, no spread run)
    total: int  # runs in the whole study
    profile: bool  # where a step's time goes, for each eager row (harness.study.profile)
    rows: list[StudyRow] = field(default_factory=list)
    state: dict = field(default_factory=dict)  # harness.study.progress's
    started: int = 0  # runs started (or skipped) so far
    stop: str = ""  # why the study stopped early ('' while it goes on)

    @property
    def repeats(self) -> int:
        return int(self.cfg.study.repeats)

    @property
    def labels(self) -> list[str]:
        return [p.label for p in self.points]


def run_study(cfg: DictConfig, out_dir: Path) -> list[StudyRow]:
    """Run the study ``cfg`` asks for into ``out_dir`` (a fresh subdirectory if it already holds one);
    returns its rows, judged."""
    validate_study(cfg)
    study = open_study(cfg, Path(out_dir))
    warn_about_the_data(study)
    try:
        for pi, point in enumerate(study.points):
            run_point(study, pi, point)
            if study.stop:
                break
    except KeyboardInterrupt:  # Ctrl+C between or inside runs: the report of what finished, then stop
        report_interrupted(study)
        raise
    report_finished(study)
    return study.rows


def open_study(cfg: DictConfig, out_dir: Path) -> StudyRun:
    """The study's directory (created), its plan, points and run order."""
    out = unique_study_dir(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    spread_seed = int(cfg.seed) + 1 if cfg.study.parity_tol is None else None
    order: list[tuple[Planned, str]] = []
    for planned in study_plan(cfg):
        order.append((planned, ""))
        if spread_seed is not None and planned.method == cfg.study.reference and not planned.compiled \
                and not planned.variant:
            order.append((planned, "spread"))
    points = sweep_points(cfg)
    repeats = int(cfg.study.repeats)
    total = len(points) * (repeats * len(order) - (repeats - 1) * (spread_seed is not None))
    console = Console(stderr=True, soft_wrap=True)  # (no mid-phrase wraps when piped)
    study = StudyRun(with_study_vocab(cfg), out, f"study-{out.name}", console, points, order, spread_seed, total,
                     profile_on(cfg))
    study.state = progress(study.labels, 0)
    return study


def unique_study_dir(path: Path) -> Path:
    """Never overwrite an earlier study: a directory that already holds one gets a fresh subdirectory."""
    if (path / "report.md").exists() or (path / "results.csv").exists() or (path / "runs").exists():
        fresh = path / f"rerun-{time.strftime('%Y%m%d-%H%M%S')}"
        print(f"study: {path} already holds a study; writing this one into {fresh}", file=sys.stderr)
        return fresh
    return path


def warn_about_the_data(study: StudyRun) -> None:
    if study.cfg.data.name == "synthetic":
        study.console.print("[yellow]study: data=synthetic (random tokens): nothing can be learned, so loss parity "
                            "cannot catch a wrong method; data=stdlib (the default) can[/]")


def run_point(study: StudyRun, pi: int, point: Point) -> None:
    """Every planned row at one sweep point, round after round; then the report of the points done."""
    study.state = progress(study.labels, pi, running=point.label)
    rows: dict[tuple, StudyRow] = {}
    probe_data: Optional[list] = None  # the point's held-out batches, drawn for its first run
    for rnd in range(1, study.repeats + 1):
        for planned, role in study.order:
            if role == "spread" and rnd > 1:
                continue  # the spread is measured once
            row = point_row(study, rows, point, planned, role)
            study.started += 1
            if row.status in NO_NUMBERS:
                continue  # decided in an earlier round (a gate that fails, fails again)
            announce(study, point, row, rnd)
            if rnd == 1 and not admitted(study, point, row, planned):
                continue
            if probe_data is None:
                probe_data = _probe_batches(point.cfg, int(study.cfg.study.parity_batches))
            run_row(study, point, row, planned, rnd, ParityProbe(probe_data, _probe_every(study.cfg)))
            if study.stop:
                break
        if study.stop:
            break
    if study.stop:
        study.state = progress(study.labels, pi, running=point.label, stopped=study.stop)
        study.console.print(f"[yellow]study: {study.stop}; the report covers what ran[/]")
        return
    study.state = progress(study.labels, pi + 1)
    if pi + 1 < len(study.points):  # the report of the points finished, charts too (the last: at the end)
        write_snapshot(study.rows, study.cfg, study.out, study.state, charts=True)


def point_row(study: StudyRun, rows: dict, point: Point, planned: Planned, role: str) -> StudyRow:
    """The row of ``planned`` (in ``role``) at ``point``: made, and added to the study, on its first run."""
    key = (planned.method, planned.compiled, planned.variant, role)
    if key not in rows:
        note = fallback(planned.method, planned.variant, planned.compiled)
        ran = accel_for(planned.method, planned.variant, planned.compiled)
        setting = configured({"config": {"accel": ran}}) if note else ""  # labelled by the loss method that ran
        rows[key] = StudyRow(planned.method, planned.compiled, "PASS", point=point.label,
                             point_values=dict(point.values), role=role, variant=planned.variant,
                             patch=planned.patch, setting=setting, fallback=note,
                             data_seed=study.spread_seed if role else None)
        study.rows.append(rows[key])
    return rows[key]


def _where(point: Point) -> str:
    return f"{point.label}: " if point.label else ""


def announce(study: StudyRun, point: Point, row: StudyRow, rnd: int) -> None:
    rep = f" (repeat {rnd}/{study.repeats})" if study.repeats > 1 else ""
    study.console.rule(f"[bold]study {study.started}/{study.total}: {escape(_where(point) + row.label)}{rep}")


def admitted(study: StudyRun, point: Point, row: StudyRow, planned: Planned) -> bool:
    """Before a row's first run: SKIPPED (False) when its methods cannot run here; else it learns how it
    is judged (timing only, parity only, gate + parity) from its methods' registry flags."""
    why = unavailable(planned.method, planned.variant, planned.compiled)
    if why:
        row.status, row.reason = "SKIPPED", why
        study.console.print(f"[yellow]study: {escape(_where(point) + row.label)} SKIPPED: {escape(why)}[/]")
        return False
    a = accel_for(planned.method, planned.variant, planned.compiled)
    ms = [kernels.get_method(x) for x, _ in accel_methods(a.method, a.loss_method, patch=a.patch)]
    row.exact, row.approximate = all(m.exact for m in ms), any(m.approximate for m in ms)
    row.judged = _judged(study.cfg, row)
    return True


def _judged(cfg: DictConfig, row: StudyRow) -> str:
    if not row.exact:
        return "timing only"
    if row.approximate:
        return "parity only (approximate by design)"
    if not cfg.study.kernel_gate:
        return "parity only (kernel gate off)"
    return "gate + parity"


def _probe_every(cfg: DictConfig) -> int:
    return int(cfg.study.parity_every or cfg.trainer.window)


def _probe_batches(pcfg: DictConfig, n: int) -> list:
    vocab = int(pcfg.model.vocab_size or data_vocab_size(pcfg.data))  # as build_model chooses it
    corpus = make_corpus(pcfg.data, seq_len(pcfg))
    return probe_batches(corpus, vocab, int(pcfg.data.batch_size), seq_len(pcfg), int(pcfg.seed), n)


def run_row(study: StudyRun, point: Point, row: StudyRow, planned: Planned, rnd: int, probe: ParityProbe) -> None:
    """One run of ``row``: trained, its result and probe curve recorded (or its failure), the report
    rewritten so that a finished run survives a later crash."""
    run_dir = study.out / "runs" / point.slug / row.slug / (f"r{rnd}" if study.repeats > 1 else "")
    before = calibrate(calibration_device(point.cfg))  # the machine's speed around the run: drift between runs
    res = run_or_record_failure(study, point, row, planned, rnd, run_dir, probe)
    if res is None:  # out of the except block: its traceback (and the run's tensors) are gone
        finish_wandb(study.cfg)
        free_memory(force=True)
        write_snapshot(study.rows, study.cfg, study.out, study.state, charts=False)
        return
    if res.get("status") == "interrupted":  # Ctrl+C: the study stops here, its partial numbers not a result
        raise Interrupted(f"{row.label} interrupted at step {res.get('steps_done')} ({res.get('stopped_by')})")
    curve = probe.collect()
    res["calibration_ms"] = [before, calibrate(calibration_device(point.cfg))]
    write_json(Path(res.get("run_dir") or run_dir) / "parity_probe.json",
               {"every": _probe_every(study.cfg), "batches": int(study.cfg.study.parity_batches), "curve": curve,
                "calibration_ms": res["calibration_ms"]})
    add_run(row, res, rnd, curve)
    row.patched = res.get("patched")
    if res.get("status") == "nonfinite":
        row.status, row.reason = "FAIL", "non-finite training loss"
    if study.profile and rnd == 1 and not planned.compiled and not row.role \
            and row.status not in NO_NUMBERS:
        row.breakdown = profile_row(point.cfg, planned.method, planned.variant)
    free_memory()
    write_snapshot(study.rows, study.cfg, study.out, study.state, charts=False)


def run_or_record_failure(study: StudyRun, point: Point, row: StudyRow, planned: Planned, rnd: int, run_dir: Path,
                          probe: ParityProbe) -> Optional[dict]:
    """The run's results; None when it raised, its failure recorded in the row and its run directory."""
    try:
        return run_one(point.cfg, planned.method, planned.compiled, run_dir, study.group, row.data_seed, (probe,),
                       planned.variant)
    except Exception as exc:  # a crash, a failed gate, an OOM: recorded, the study goes on
        record_failure(row, exc, run_dir, rnd, point, study.console)
        return None


def run_one(cfg: DictConfig, method: str, compiled: bool, run_dir: Path, group: str,
            data_seed: Optional[int] = None, callbacks: tuple = (), variant: str = "") -> dict:
    """One training run of the accel configuration ``method`` (as its ``variant`` runs) with the
    study's settings, through harness.train."""
    c = copy.deepcopy(cfg)
    with open_dict(c):
        c.accel = accel_for(method, variant, compiled)
        c.compile_model = compiled
        c.check_kernel = bool(cfg.study.kernel_gate)
        c.logger.group = group
        if data_seed is not None:
            c.data.seed = data_seed
        del c["study"]
    return run_training(c, run_dir, group=group, extra_callbacks=callbacks, resume_hint=False)  # (the study's own)


def report_interrupted(study: StudyRun) -> None:
    """After Ctrl+C: the report of the runs that finished, marked incomplete with where it stopped."""
    rows = study.rows
    cut = [r.label for r in rows if not r.runs and r.status == "PASS"]  # the run under way: no result
    why = "the study was interrupted (Ctrl+C)" + (f" during {cut[0]}" if cut else "")
    study.state = dict(study.state, complete=False, stopped=why)
    write_snapshot([r for r in rows if r.runs or r.status != "PASS"], study.cfg, study.out, study.state, charts=True)
    study.console.print(f"[yellow]study: interrupted; the report of what finished -> {study.out / 'report.md'}[/]")
    # a study has no resume: the same command runs it again, into a fresh directory beside this one
    study.console.print(f"study: to finish it, run it again: {escape(shlex.join(['python', '-m', 'harness.study', *sys.argv[1:]]))}")


def report_finished(study: StudyRun) -> None:
    """The whole report, judged (an early stop marked in it), on disk, in W&B and on stdout."""
    settings = finish(study.rows, study.cfg)
    line = progress_line(study.state)
    write_outputs(study.rows, study.cfg, study.out, partial=False, settings=settings, notes=(line,) if line else (),
                  progress=study.state)
    log_to_wandb(study.rows, study.cfg, study.out, study.group)
    study.console.print(f"[bold]study[/]: report -> {study.out / 'report.md'}")
    print((study.out / "report.md").read_text())
