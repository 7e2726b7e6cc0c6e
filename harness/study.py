"""Speedup study: ``python -m harness.study [overrides]`` runs every chosen accel configuration end to end
on the same model, data, seed and batch order, behind correctness checks, and writes one study directory:

* ``report.md``, ``results.csv`` (one row per method and sweep point) and ``runs.csv`` (one row per
  run): tokens/s (median over repeats, 95% interval), speedups vs the baseline (``study.baseline``,
  default ``naive``) and the reference (``study.reference``, default ``torch``) with their intervals
  ("within noise" when an interval contains 1.0), step time p50/p90 and the noisy flag, peak memory,
  MFU, warm-up seconds, final loss, parity and PASS/FAIL with the reason (harness.study_report);
* ``throughput.png``, ``loss.png`` and, for sweeps, ``scaling.png`` and ``memory.png`` (harness.study_charts);
* ``runs/[<point>/]<method>[/r<repeat>]/``: each run's ``results.json``, ``parity_probe.json`` (and W&B run,
  grouped by study).

Which configurations: ``study.methods`` (names of files in ``conf/accel/``), by default every one, so a
method added as one module + one config file is in the default study; those that cannot run here are
SKIPPED with the reason. Timing-only methods (the registry's ``exact=False``, e.g. the no-softmax
floor) are timed, never compared.
Each configuration of ``study.loss_split`` (default triton, cuda) also runs with
``accel.patch=[attention]``, each of ``study.linear_loss`` with ``accel.loss_form=linear``: rows
``triton: attention + loss``, ``triton: attention``, ``triton: attention + linear loss``, and the
report's table of what the loss kernel adds (harness.study_split).

Correctness, before any speedup is reported (docs/studies.md): every op a method patches is checked
against float64 on the run's shapes, forward and backward (the kernel gate; ``study.kernel_gate=false``
skips it, and methods registered as ``approximate`` skip it by design); then its held-out probe loss
must track the reference run's within a tolerance derived from the reference's own spread across two
data orders (harness.parity). The default data is the stdlib corpus (bytes, where the loss falls) with
the model's vocabulary kept at the study model's size (``model.vocab_size``), so the LM head costs what
it costs in the real model.

Repeats (``study.repeats=N``) run round-robin: every method once, then every method again.
Sweeps (``study.sweep=context`` over ``study.contexts`` at a fixed number of tokens per step, or
``study.sweep=model`` over ``study.models``) repeat all of it at every point; a point that runs out
of memory is recorded as OOM, never a crash of the study. A method that crashes is recorded with its
error; the others go on. An existing study directory is never overwritten: a re-run writes into a
fresh ``rerun-<time>`` subdirectory. The report is rewritten after every run and its charts after
every point, so a study stopped early (a time limit, Ctrl+C) leaves the report of what it finished,
marked incomplete (harness.study_progress).
"""

from __future__ import annotations

import copy
import gc
import json
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

from harness.availability import accel_unavailable
from harness.cli import run_app
from harness.config import CONF_DIR, AccelConfig, ConfigError, accel_methods, accel_names, group_options
from harness.results import atomic_write_text, write_json
from harness.study_progress import progress, progress_line, write_snapshot
from harness.study_judge import finish
from harness.study_report import NO_NUMBERS, StudyRow, add_run, log_to_wandb, write_outputs
from harness.study_split import KEYS as SPLIT_KEYS
from harness.study_split import VARIANTS, Planned, expand
from harness.study_split import check as check_split

SWEEPS = ("context", "model")


def model_names() -> list[str]:
    return group_options("model")


def accel_config(name: str) -> DictConfig:
    path = Path(CONF_DIR) / "accel" / f"{name}.yaml"
    if not path.exists():
        raise ValueError(f"study.methods: unknown method {name!r}; options: {', '.join(accel_names())}")
    return OmegaConf.load(path)


def accel_for(name: str, variant: str = "") -> DictConfig:
    """The accel configuration ``name``, every key filled in, as its ``variant`` runs (harness.study_split)."""
    return OmegaConf.merge(OmegaConf.structured(AccelConfig), accel_config(name), VARIANTS[variant])


def unavailable(name: str, variant: str = "") -> Optional[str]:
    """Why the accel configuration ``name`` (as its ``variant`` runs) cannot run here (None: it can)."""
    a = accel_for(name, variant)
    return accel_unavailable(a.method, dict(a.options or {}), a.loss_method, list(a.patch))


def default_methods() -> list[str]:
    """The default study: every accel configuration, the reference and baseline first."""
    return accel_names()


def study_plan(cfg: DictConfig) -> list[Planned]:
    """(accel config, compiled, variant, patch) in run order: the reference first (every other run is
    compared with it), the baseline next, then the rest, then the compiled runs (the slow compiles
    last); each configuration of study.loss_split / study.linear_loss followed by its twins
    (harness.study_split)."""
    names = list(cfg.study.methods) if cfg.study.methods is not None else default_methods()
    first = [n for n in (cfg.study.reference, cfg.study.baseline) if n]
    order = list(dict.fromkeys([n for n in first if n in names or n == cfg.study.reference] + names))
    plan = [(m, False) for m in order] + [(m, True) for m in cfg.study.compiled]
    return expand(plan, cfg.study, accel_for)


# -- the study's own config checks (the precheck runs them before any work) ----------------------


def _known(key: str, names, choices: list[str], where: str) -> None:
    bad = [n for n in ([names] if isinstance(names, str) else list(names)) if n not in choices]
    if bad:
        raise ConfigError(
            f"config value {key}={bad[0]!r} is not accepted: no such configuration in {where}; the ones there "
            f"are: {', '.join(choices)}. No study was started."
        )


def validate_study(cfg: DictConfig) -> None:
    """Every check of a training run (harness.train's), plus the study's keys: known methods and
    models, a parity window inside the run, probe points on window boundaries, sweep points that
    make sense. Raises ConfigError (a ValueError) naming the key, the value and what is accepted."""
    from harness.config import validate

    validate(cfg)
    if cfg.data.name == "text" and not Path(str(cfg.data.path)).expanduser().is_file():
        raise ConfigError(f"data.path={cfg.data.path!r}: no such file (data=text needs an existing text file). "
                          "No study was started.")
    s, t = cfg.study, cfg.trainer
    names = accel_names()
    if s.methods is not None:
        _known("study.methods", s.methods, names, "conf/accel/")
    _known("study.compiled", s.compiled, names, "conf/accel/")
    _known("study.reference", s.reference, names, "conf/accel/")
    _known("study.baseline", s.baseline, names, "conf/accel/")
    for key in SPLIT_KEYS:
        _known(f"study.{key}", s[key], names, "conf/accel/")

    def bad(key: str, value, accepted: str) -> ConfigError:
        return ConfigError(f"config value {key}={value!r} is not accepted: {accepted}. No study was started.")

    if s.parity_steps is not None and not 1 <= s.parity_steps <= t.max_steps:
        raise bad("study.parity_steps", s.parity_steps,
                  f"null (the whole run) or an integer from 1 to trainer.max_steps ({t.max_steps}): parity compares "
                  "the loss over the first study.parity_steps steps of each run, so the window cannot be longer "
                  "than the run (raise trainer.max_steps, or lower study.parity_steps)")
    every = s.parity_every if s.parity_every is not None else t.window
    if every < 1 or every % t.window:
        raise bad("study.parity_every", s.parity_every,
                  f"null (trainer.window) or a multiple of trainer.window ({t.window}), so that the probe never "
                  "falls inside a throughput window")
    if every > (s.parity_steps or t.max_steps):
        raise bad("study.parity_every", s.parity_every,
                  f"at most the parity window ({s.parity_steps or t.max_steps} steps), so that the probe runs "
                  "after some training")
    if s.parity_batches < 1:
        raise bad("study.parity_batches", s.parity_batches, "an integer >= 1")
    if not s.parity_k > 0:
        raise bad("study.parity_k", s.parity_k, "a number > 0")
    if not s.parity_floor >= 0:
        raise bad("study.parity_floor", s.parity_floor, "a number >= 0")
    if s.parity_tol is not None and not s.parity_tol > 0:
        raise bad("study.parity_tol", s.parity_tol, "null (derived from the reference's spread) or a number > 0")
    if s.repeats < 1:
        raise bad("study.repeats", s.repeats, "an integer >= 1")
    if s.sweep is not None and s.sweep not in SWEEPS:
        raise bad("study.sweep", s.sweep, f"null (no sweep) or one of {', '.join(SWEEPS)}")
    if s.sweep == "context":
        contexts = list(s.contexts)
        if not contexts or any(not isinstance(c, int) or c < 1 for c in contexts):
            raise bad("study.contexts", contexts, "a non-empty list of positive integers (sequence lengths)")
        tokens = s.tokens_per_step or int(cfg.data.batch_size) * int(cfg.data.seq_len or cfg.model.context)
        uneven = [c for c in contexts if tokens % c or tokens < c]
        if uneven:
            raise bad("study.tokens_per_step", tokens,
                      f"a multiple of every swept context (batch = tokens / T); {uneven[0]} does not divide it. "
                      "Set study.tokens_per_step to a multiple of the largest context")
    if s.sweep == "model":
        if not list(s.models):
            raise bad("study.models", list(s.models), "a non-empty list of model configs")
        _known("study.models", s.models, model_names(), "conf/model/")
    if s.tokens_per_step is not None and s.tokens_per_step < 1:
        raise bad("study.tokens_per_step", s.tokens_per_step, "null or an integer >= 1")
    check_split(s, names, accel_for, bad)


# -- sweep points ------------------------------------------------------------------------------


@dataclass
class Point:
    label: str  # "" outside a sweep
    slug: str  # its run directory ("" outside a sweep)
    values: dict = field(default_factory=dict)
    cfg: DictConfig = None


def sweep_points(cfg: DictConfig) -> list[Point]:
    """The configurations a study runs: one, or one per swept context / model."""
    s = cfg.study
    if s.sweep is None:
        return [Point("", "", {}, cfg)]
    points = []
    if s.sweep == "context":
        tokens = s.tokens_per_step or int(cfg.data.batch_size) * int(cfg.data.seq_len or cfg.model.context)
        for T in s.contexts:
            c = copy.deepcopy(cfg)
            with open_dict(c):
                c.model.context, c.data.seq_len, c.data.batch_size = int(T), None, int(tokens // T)
            points.append(Point(f"T={T} batch {tokens // T}", f"T{T}", {"context": int(T),
                                                                      "batch_size": int(tokens // T)}, c))
    else:
        for name in s.models:
            loaded = OmegaConf.load(Path(CONF_DIR) / "model" / f"{name}.yaml")
            c = copy.deepcopy(cfg)
            with open_dict(c):
                c.model = OmegaConf.merge(c.model, loaded.model)
                if "data" in loaded and "batch_size" in loaded.data:
                    c.data.batch_size = loaded.data.batch_size
            points.append(Point(name, name, {"model": name, "context": int(c.model.context),
                                             "batch_size": int(c.data.batch_size)}, c))
    return points


def unique_study_dir(path: Path) -> Path:
    """Never overwrite an earlier study: a directory that already holds one gets a fresh subdirectory."""
    if (path / "report.md").exists() or (path / "results.csv").exists() or (path / "runs").exists():
        fresh = path / f"rerun-{time.strftime('%Y%m%d-%H%M%S')}"
        print(f"study: {path} already holds a study; writing this one into {fresh}", file=sys.stderr)
        return fresh
    return path


def is_oom(exc: BaseException) -> bool:
    """An out-of-memory error: torch's own, or a RuntimeError (a failed gate included) that says so."""
    import torch

    types = tuple(t for t in (getattr(torch.cuda, "OutOfMemoryError", None), getattr(torch, "OutOfMemoryError", None))
                  if isinstance(t, type))
    if types and isinstance(exc, types):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def run_one(cfg: DictConfig, method: str, compiled: bool, run_dir: Path, group: str,
            data_seed: Optional[int] = None, callbacks: tuple = (), variant: str = "") -> dict:
    from harness.training import run_training

    c = copy.deepcopy(cfg)
    with open_dict(c):
        c.accel = accel_for(method, variant)
        c.compile_model = compiled
        c.check_kernel = bool(cfg.study.kernel_gate)
        c.logger.group = group
        if data_seed is not None:
            c.data.seed = data_seed
        del c["study"]
    return run_training(c, run_dir, group=group, extra_callbacks=callbacks)


def _judged(cfg: DictConfig, row: StudyRow) -> str:
    if not row.exact:
        return "timing only"
    if row.approximate:
        return "parity only (approximate by design)"
    if not cfg.study.kernel_gate:
        return "parity only (kernel gate off)"
    return "gate + parity"


def _probe_batches(pcfg: DictConfig, n: int) -> list:
    from harness.build import seq_len
    from harness.data import data_vocab_size, make_corpus
    from harness.probe import probe_batches

    vocab = int(pcfg.model.vocab_size or data_vocab_size(pcfg.data))  # as build_model chooses it
    corpus = make_corpus(pcfg.data, seq_len(pcfg))
    return probe_batches(corpus, vocab, int(pcfg.data.batch_size), seq_len(pcfg), int(pcfg.seed), n)


def run_study(cfg: DictConfig, out_dir: Path) -> list[StudyRow]:
    import kernels
    from rich.console import Console

    from harness.probe import ParityProbe

    validate_study(cfg)
    out = unique_study_dir(Path(out_dir))
    out.mkdir(parents=True, exist_ok=True)
    group = f"study-{out.name}"
    console = Console(stderr=True, soft_wrap=True)  # (no mid-phrase wraps when piped)
    plan = study_plan(cfg)
    points = sweep_points(cfg)
    repeats = int(cfg.study.repeats)
    spread_seed = int(cfg.seed) + 1 if cfg.study.parity_tol is None else None
    every = int(cfg.study.parity_every or cfg.trainer.window)
    profile = _profile_on(cfg)
    if cfg.data.name == "synthetic":
        console.print("[yellow]study: data=synthetic (random tokens): nothing can be learned, so loss parity cannot "
                      "catch a wrong method; data=stdlib (the default) can[/]")
    order: list[tuple[Planned, str]] = []
    for planned in plan:
        order.append((planned, ""))
        if spread_seed is not None and planned.method == cfg.study.reference and not planned.compiled \
                and not planned.variant:
            order.append((planned, "spread"))
    total = len(points) * (repeats * len(order) - (repeats - 1) * (spread_seed is not None))
    rows: list[StudyRow] = []
    labels = [p.label for p in points]
    state = progress(labels, 0)
    n = 0
    stop = ""
    try:
        for pi, point in enumerate(points):
            state = progress(labels, pi, running=point.label)
            prow: dict[tuple, StudyRow] = {}
            probe_data = None
            for rnd in range(1, repeats + 1):
                for planned, role in order:
                    if role == "spread" and rnd > 1:
                        continue  # the spread is measured once
                    method, compiled, variant = planned.method, planned.compiled, planned.variant
                    key = (method, compiled, variant, role)
                    row = prow.get(key)
                    if row is None:
                        row = prow[key] = StudyRow(method, compiled, "PASS", point=point.label,
                                                   point_values=dict(point.values), role=role,
                                                   variant=variant, patch=planned.patch,
                                                   data_seed=spread_seed if role else None)
                        rows.append(row)
                    n += 1
                    if row.status in NO_NUMBERS:
                        continue  # decided in an earlier round (a gate that fails, fails again)
                    where = f"{point.label}: " if point.label else ""
                    rep = f" (repeat {rnd}/{repeats})" if repeats > 1 else ""
                    console.rule(f"[bold]study {n}/{total}: {where}{row.label}{rep}")
                    if rnd == 1:
                        why = unavailable(method, variant)
                        if why:
                            row.status, row.reason = "SKIPPED", why
                            console.print(f"[yellow]study: {where}{row.label} SKIPPED: {why}[/]")
                            continue
                        a = accel_for(method, variant)
                        ms = [kernels.get_method(x) for x, _ in accel_methods(a.method, a.loss_method, patch=a.patch)]
                        row.exact, row.approximate = all(m.exact for m in ms), any(m.approximate for m in ms)
                        row.judged = _judged(cfg, row)
                    if probe_data is None:
                        probe_data = _probe_batches(point.cfg, int(cfg.study.parity_batches))
                    probe = ParityProbe(probe_data, every)
                    run_dir = out / "runs" / point.slug / row.slug / (f"r{rnd}" if repeats > 1 else "")
                    try:
                        res = run_one(point.cfg, method, compiled, run_dir, group, row.data_seed, (probe,), variant)
                    except Exception as exc:  # a crash, a failed gate, an OOM: recorded, the study goes on
                        _record_failure(row, exc, run_dir, rnd, point, console)
                        res = None
                    if res is None:  # out of the except block: its traceback (and the run's tensors) are gone
                        _finish_wandb(cfg)
                        _free_memory(force=True)
                        write_snapshot(rows, cfg, out, state, charts=False)
                        continue
                    curve = probe.collect()
                    write_json(Path(res.get("run_dir") or run_dir) / "parity_probe.json",
                               {"every": every, "batches": int(cfg.study.parity_batches), "curve": curve})
                    add_run(row, res, rnd, curve)
                    row.patched = res.get("patched")
                    if res.get("status") == "interrupted":
                        row.status, row.reason = "CRASH", f"interrupted at step {res.get('steps_done')}"
                        stop = "the study stopped: a run was interrupted"
                    elif res.get("status") == "nonfinite":
                        row.status, row.reason = "FAIL", "non-finite training loss"
                    if profile and rnd == 1 and not compiled and not role and row.status not in NO_NUMBERS:
                        row.breakdown = _profile(point.cfg, method, variant)
                    _free_memory()
                    write_snapshot(rows, cfg, out, state, charts=False)  # finished runs survive a later crash
                    if stop:
                        break
                if stop:
                    break
            if stop:
                state = progress(labels, pi, running=point.label, stopped=stop)
                console.print(f"[yellow]study: {stop}; the report covers what ran[/]")
                break
            state = progress(labels, pi + 1)
            if pi + 1 < len(points):  # the report of the points finished, charts too (the last: below)
                write_snapshot(rows, cfg, out, state, charts=True)
    except KeyboardInterrupt:  # Ctrl+C between or inside runs: the report of what finished, then stop
        cut = [r.label for r in rows if not r.runs and r.status == "PASS"]  # the run under way: no result
        why = "the study was interrupted (Ctrl+C)" + (f" during {cut[0]}" if cut else "")
        state = dict(state, complete=False, stopped=why)
        write_snapshot([r for r in rows if r.runs or r.status != "PASS"], cfg, out, state, charts=True)
        console.print(f"[yellow]study: interrupted; the report of what finished -> {out / 'report.md'}[/]")
        raise

    settings = finish(rows, cfg)
    line = progress_line(state)
    write_outputs(rows, cfg, out, partial=False, settings=settings, notes=(line,) if line else (), progress=state)
    log_to_wandb(rows, cfg, out, group)
    console.print(f"[bold]study[/]: report -> {out / 'report.md'}")
    print((out / "report.md").read_text())
    return rows


def _record_failure(row: StudyRow, exc: BaseException, run_dir: Path, rnd: int, point: Point, console) -> None:
    from harness.gate import GateError
    from harness.reliability import NonFiniteLossError

    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    rep = f"repeat {rnd}: " if rnd > 1 else ""
    if is_oom(exc):
        where = f" at T = {point.values['context']}" if "context" in point.values else \
            f" with {point.values['model']}" if "model" in point.values else ""
        row.status, row.reason = "OOM", f"{rep}out of memory{where} ({type(exc).__name__}: {first[:160]})"
    elif isinstance(exc, (GateError, NonFiniteLossError)):
        row.status, row.reason = "FAIL", rep + first
    else:
        row.status, row.reason = "CRASH", rep + first
        atomic_write_text(Path(run_dir) / "error.txt", traceback.format_exc())
    _close_record(Path(run_dir) / "results.json", row)
    console.print(f"[red]study: {point.label + ': ' if point.label else ''}{row.label} {row.status}: {row.reason}[/]")


def _close_record(path: Path, row: StudyRow) -> None:
    """A run the study stopped (an OOM, a failed gate, a crash) leaves the results.json it wrote before
    training saying "running": close it with the study's verdict, so that harness.report reads it so."""
    try:
        res = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if res.get("status") == "running":
        status = {"OOM": "oom", "FAIL": "failed"}.get(row.status, "crashed")
        write_json(path, dict(res, status=status, error=row.reason))


def _finish_wandb(cfg: DictConfig) -> None:
    """A run that raised leaves its W&B run open: close it, so that the next run starts its own."""
    if cfg.logger.name != "wandb":
        return
    import wandb

    if wandb.run is not None:
        wandb.finish(exit_code=1)


def _profile_on(cfg: DictConfig) -> bool:
    if cfg.study.profile is not None:
        return bool(cfg.study.profile)
    import torch

    return torch.cuda.is_available() and cfg.trainer.accelerator in ("auto", "gpu", "cuda")


def _profile(cfg: DictConfig, method: str, variant: str = "") -> dict:
    try:
        from harness.breakdown import profile_step

        return profile_step(cfg, accel_for(method, variant)).as_dict()
    except Exception as exc:
        kind = "out of memory" if is_oom(exc) else type(exc).__name__
        return {"error": f"{kind}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]}
    finally:
        _free_memory()


def _free_memory(force: bool = False) -> None:
    """Drop what the last run left (a GPU's cached blocks); on the CPU only after a failure (a full
    collection costs a fraction of a second there, and CPU runs are small)."""
    import torch

    if force or torch.cuda.is_available():
        gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="study")
def hydra_main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    run_study(cfg, Path(HydraConfig.get().runtime.output_dir))


def main() -> None:
    run_app(hydra_main, "study", validate_study, app="study")


if __name__ == "__main__":
    main()
