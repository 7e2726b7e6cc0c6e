"""Speedup study: ``python -m harness.study [overrides]`` runs every chosen accel configuration end to end
on the same model, data, seed and batch order, behind a correctness gate, and writes one study directory:

* ``report.md`` and ``results.csv``: method, compiled or not, tokens/s (median), speedup vs the baseline
  (``study.baseline``, default ``naive``) and vs the reference (``study.reference``, default ``torch``),
  step time p50/p90, peak memory, MFU, warm-up/compile seconds, final loss and its difference from the
  reference run, gate and parity PASS/FAIL with the reason (harness.study_report);
* ``throughput.png`` (tokens/s and speedup by method) and ``loss.png`` (loss curves overlaid);
* ``runs/<method>/``: each run's own ``results.json`` (and W&B run, grouped by study).

Which configurations: ``study.methods`` (names of files in ``conf/accel/``), by default every one whose
method can run here, so a method added as one module + one config file is in the default study.
Timing-only methods (the registry's ``exact=False``, e.g. the no-softmax floor) are timed, never
compared. Gate: before a method is timed every op it patches is checked against float64 on the
study's shapes (forward and backward); during the study its loss over the first K steps must track
the reference run's within a bf16 tolerance. A method failing either is FAIL everywhere, with the
reason, and gets no speedup. A method that crashes is recorded with its error; the others go on. An
existing study directory is never overwritten: a re-run writes into a fresh ``rerun-<time>``
subdirectory.
"""

from __future__ import annotations

import copy
import gc
import sys
import time
import traceback
from pathlib import Path
from typing import Optional

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

from harness.cli import run_app
from harness.config import CONF_DIR, AccelConfig, validate
from harness.results import atomic_write_text
from harness.study_report import StudyRow, finish, log_to_wandb, write_outputs


def accel_names() -> list[str]:
    """Every accel configuration in ``conf/accel/``, sorted."""
    return sorted(p.stem for p in (Path(CONF_DIR) / "accel").glob("*.yaml"))


def accel_config(name: str) -> DictConfig:
    path = Path(CONF_DIR) / "accel" / f"{name}.yaml"
    if not path.exists():
        raise ValueError(f"study.methods: unknown method {name!r}; options: {', '.join(accel_names())}")
    return OmegaConf.load(path)


def unavailable(name: str) -> Optional[str]:
    """Why the accel configuration ``name`` cannot run here (None: it can)."""
    import kernels

    a = accel_config(name)
    try:
        return kernels.unavailable_reason(a.method, **dict(a.get("options") or {}))
    except (kernels.UnknownMethodError, ValueError) as exc:
        return str(exc)


def default_methods() -> list[str]:
    """The default study: every accel configuration, the reference and baseline first."""
    return accel_names()


def study_plan(cfg: DictConfig) -> list[tuple[str, bool]]:
    """(accel config, compiled) in run order: the reference first (every other run is compared with
    it), the baseline next, then the rest, then the compiled runs (the slow compiles last)."""
    names = list(cfg.study.methods) if cfg.study.methods is not None else default_methods()
    first = [n for n in (cfg.study.reference, cfg.study.baseline) if n]
    order = list(dict.fromkeys([n for n in first if n in names or n == cfg.study.reference] + names))
    return [(m, False) for m in order] + [(m, True) for m in cfg.study.compiled]


def unique_study_dir(path: Path) -> Path:
    """Never overwrite an earlier study: a directory that already holds one gets a fresh subdirectory."""
    if (path / "report.md").exists() or (path / "results.csv").exists() or (path / "runs").exists():
        fresh = path / f"rerun-{time.strftime('%Y%m%d-%H%M%S')}"
        print(f"study: {path} already holds a study; writing this one into {fresh}", file=sys.stderr)
        return fresh
    return path


def run_one(cfg: DictConfig, method: str, compiled: bool, run_dir: Path, group: str) -> dict:
    from harness.train import run_training

    c = copy.deepcopy(cfg)
    with open_dict(c):
        c.accel = OmegaConf.merge(OmegaConf.structured(AccelConfig), accel_config(method))
        c.compile_model = compiled
        c.logger.group = group
        del c["study"]
    return run_training(c, run_dir, group=group)


def run_study(cfg: DictConfig, out_dir: Path) -> list[StudyRow]:
    import kernels

    validate(cfg)
    out = unique_study_dir(Path(out_dir))
    out.mkdir(parents=True, exist_ok=True)
    group = f"study-{out.name}"
    plan = study_plan(cfg)
    rows: list[StudyRow] = []
    from rich.console import Console

    console = Console(stderr=True)
    for i, (method, compiled) in enumerate(plan, 1):
        row = StudyRow(method, compiled, "PASS")
        console.rule(f"[bold]study {i}/{len(plan)}: {row.label}")
        why = unavailable(method)
        if why:
            row.status, row.reason = "SKIPPED", why
            console.print(f"[yellow]study: {row.label} SKIPPED: {why}[/]")
            rows.append(row)
            continue
        row.exact = kernels.get_method(accel_config(method).method).exact
        run_dir = out / "runs" / row.label.replace(" + ", "+")
        try:
            res = run_one(cfg, method, compiled, run_dir, group)
        except Exception as exc:  # a crash or a failed gate: recorded, the study goes on
            from harness.gate import GateError
            from harness.reliability import NonFiniteLossError

            gate_failed = isinstance(exc, (GateError, NonFiniteLossError))
            row.status = "FAIL" if gate_failed else "CRASH"
            row.reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if not gate_failed:
                atomic_write_text(run_dir / "error.txt", traceback.format_exc())
            rows.append(row)
            _free_memory()
            continue
        row.tokens_per_s = res.get("tokens_per_s")
        row.step_ms_p50, row.step_ms_p90 = res.get("step_ms_p50"), res.get("step_ms_p90")
        row.peak_mem_gib, row.mfu, row.warmup_s = res.get("peak_mem_gib"), res.get("mfu"), res.get("warmup_s")
        row.final_loss, row.loss_curve = res.get("final_train_loss"), res.get("loss_curve", [])
        row.patched = res.get("patched")
        if not row.exact:
            row.status, row.reason = "TIMING-ONLY", f"timing only: {kernels.get_method(accel_config(method).method).summary}"
        if cfg.study.profile and not compiled and (row.patched or {}).get("attention") == "composed":
            try:
                row.breakdown = profile_method(cfg, accel_config(method).method).as_dict()
            except Exception as exc:
                row.breakdown = {"error": f"{type(exc).__name__}: {exc}"}
        rows.append(row)
        _free_memory()
        write_outputs(rows, cfg, out, partial=True)  # completed results survive a later crash

    finish(rows, cfg)
    write_outputs(rows, cfg, out, partial=False)
    log_to_wandb(rows, cfg, out, group)
    console.print(f"[bold]study[/]: report -> {out / 'report.md'}")
    print((out / "report.md").read_text())
    return rows


def profile_method(cfg: DictConfig, method: str):
    """Where one training step's time goes with this method's softmax (see harness.breakdown)."""
    import torch

    import kernels
    from harness.breakdown import measure
    from harness.build import build_model, seq_len
    from harness.data import BatchStream, make_corpus

    device = "cuda" if torch.cuda.is_available() else "cpu"
    seq = seq_len(cfg)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg).to(device)
    corpus = make_corpus(cfg.data, seq)
    stream = BatchStream(None if corpus is None else corpus.train, model.config.vocab_size,
                         int(cfg.data.batch_size), seq, cfg.seed, "train", 0, 3)
    try:
        return measure(model, list(stream), kernels.bind(method, "softmax"))
    finally:
        del model
        _free_memory()


def _free_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="study")
def hydra_main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    run_study(cfg, Path(HydraConfig.get().runtime.output_dir))


def main() -> None:
    from harness.config import validate_study

    run_app(hydra_main, "study", validate_study, app="study")


if __name__ == "__main__":
    main()
