"""Training entry point: ``python -m harness.train [group=option ...] [key=value ...]`` (or ``harness-train``).

A Hydra app (``--help`` lists the methods, models, data and the keys people change most; harness.cli).
It builds the model, applies the acceleration method chosen by ``accel=...`` (harness.accel), checks
every op it patched against float64 (harness.gate), trains it with Lightning, logs throughput to W&B
(offline by default) and writes ``results.json`` into the run directory (harness.results).
``resume=<run dir>`` continues or extends a run in its own directory (harness.resume).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any, Optional

import hydra
from omegaconf import DictConfig

from harness.cli import UsageError, fail, method_unavailable_message, run_app, wants_help
from harness.config import CONF_DIR, validate  # also registers the structured-config schema
from harness.gate import GateError  # noqa: F401  (re-exported: callers catch it from here)


class OutputDirError(OSError):
    """The run directory cannot be created or written."""


def prepare_run_dir(run_dir: Path) -> Path:
    run_dir = Path(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise OutputDirError(f"cannot write the output directory {run_dir}: {exc.strerror or exc}") from exc
    return run_dir


def _quiet_lightning_handlers() -> None:
    # Lightning prints through its own handlers; under Hydra the root logger prints (and files) it too
    if logging.getLogger().hasHandlers():
        for name in ("lightning", "lightning.pytorch"):
            logging.getLogger(name).handlers.clear()


def _gate(cfg: DictConfig, built, gpu: bool, precision: str, console) -> dict:
    from harness.build import compute_dtype, seq_len
    from harness.gate import RunShapes, run_gate

    if not cfg.check_kernel:
        return {"checked": False, "reason": "switched off (check_kernel=false)"}
    c = built.model.config
    shapes = RunShapes(heads=c.n_head, seq_len=seq_len(cfg), head_dim=c.n_embd // c.n_head, vocab=c.vocab_size,
                       n_embd=c.n_embd, tokens=int(cfg.data.batch_size) * seq_len(cfg),
                       dtype=compute_dtype(precision), device="cuda" if gpu else "cpu")
    info = run_gate(built.applied, shapes)
    if info.get("checked"):
        for chk in info["checks"]:
            console.print(f"[bold]harness[/]: correctness gate passed for {chk['method']!r} {chk['op']} on "
                          f"{tuple(chk['shape'])} {chk['dtype']} (forward error {chk['fwd_error']:.1e}, backward "
                          f"{chk['bwd_error']:.1e})")
    return info


def _callbacks(cfg: DictConfig, run_dir: Path, monitor, extra: tuple):
    from lightning.pytorch.callbacks import ModelCheckpoint

    from harness.console import HarnessProgressBar
    from harness.reliability import GracefulStop, NonFiniteLossGuard

    graceful = GracefulStop(run_dir / "checkpoints")
    guard = NonFiniteLossGuard(cfg.trainer.window, cfg.accel.name, cfg.trainer.on_nonfinite)
    callbacks: list = [monitor, guard, graceful, HarnessProgressBar(refresh_rate=cfg.trainer.window), *extra]
    if cfg.trainer.ckpt_every:
        callbacks.append(ModelCheckpoint(
            dirpath=str(run_dir / "checkpoints"), filename="step{step}", every_n_train_steps=cfg.trainer.ckpt_every,
            save_last=True, save_top_k=1, auto_insert_metric_name=False,
        ))
    return callbacks, graceful, guard


def run_training(
    cfg: DictConfig,
    run_dir: Path,
    group: Optional[str] = None,
    extra_callbacks: tuple = (),
    previous: Optional[dict] = None,
) -> dict[str, Any]:
    """Train once with a composed config; returns (and writes to run_dir/results.json) the results.

    ``previous``: the results of the interrupted run that ``run_dir`` holds, to resume it from its
    ``checkpoints/last.ckpt`` (same W&B run id, same data position, one results.json for the whole run).
    """
    import lightning as L
    import torch
    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    import kernels
    from harness.build import build, data_seed, on_gpu, resolve_precision, seq_len, tokens_per_step
    from harness.config import DEFAULT_PATCH, accel_methods, patch_words, to_container
    from rich.markup import escape

    from harness.console import RunConsole, quiet_third_party
    from harness.env import environment
    from harness.loggers import make_logger, wandb_mode
    from harness.reliability import NonFiniteLossError
    from harness.results import final_record, running_record, write_json
    from harness.task import LanguageModelTask, TokenDataModule
    from harness.throughput import ThroughputMonitor, peak_bf16_flops

    validate(cfg)
    _quiet_lightning_handlers()
    quiet_third_party(resuming=previous is not None)
    console = RunConsole(quiet=rank_zero_only.rank != 0)  # one voice in a distributed run
    run_dir = prepare_run_dir(run_dir)
    gpu = on_gpu(cfg)
    precision = resolve_precision(str(cfg.trainer.precision), gpu)
    # unknown / not runnable here: fail before any work (the loss's own method too, accel.loss_method)
    methods = [kernels.get_method(n) for n, _ in accel_methods(cfg.accel.method, cfg.accel.get("loss_method"),
                                                                 patch=list(cfg.accel.patch))]
    prepared: dict = {}
    for i, method in enumerate(methods):
        if method.prepare is not None:  # e.g. build the CUDA extension: timed apart, reported
            done = method.prepare()
            if i:
                prepared["loss_method"] = done
            else:
                prepared = dict(done)
            console.print(f"[bold]harness[/]: prepared method {method.name!r}: {done}")

    L.seed_everything(cfg.seed, workers=True, verbose=False)
    built = build(cfg)
    model, applied = built.model, built.applied
    gate_info = _gate(cfg, built, gpu, precision, console)
    if gpu:
        torch.cuda.reset_peak_memory_stats()

    env = environment()
    device = env["device_name"] if gpu else "CPU"
    label = f"{cfg.accel.name}" + (" + compiled model" if cfg.compile_model else "")
    console.print(
        f"[bold]harness[/]: accel=[cyan]{label}[/] ({applied.describe()}) model={cfg.model.name} "
        f"({model.matmul_params() / 1e6:.1f}M matmul params) data={cfg.data.name} on [green]{device}[/] "
        f"precision={precision} -> {escape(str(run_dir))}"
    )
    if not gpu and cfg.model.name not in ("tiny", "llama_tiny"):
        console.print("[yellow]no CUDA GPU here: this model will train slowly on the CPU; for a quick CPU run use "
                      "model=tiny (or llama_tiny) trainer=cpu[/]")

    t = cfg.trainer
    task = LanguageModelTask(
        model, lr=t.lr, weight_decay=t.weight_decay, betas=(t.beta1, t.beta2), max_steps=t.lr_decay_steps or t.max_steps,
        lr_warmup_steps=t.lr_warmup_steps, min_lr_ratio=t.min_lr_ratio, compile_model=cfg.compile_model,
        compile_mode=cfg.compile_mode, grad_clip=float(t.grad_clip or 0.0), fused_optimizer=precision != "16-mixed",
    )
    seq = seq_len(cfg)
    dm = TokenDataModule(built.corpus, model.config.vocab_size, int(cfg.data.batch_size), seq, data_seed(cfg),
                         t.max_steps, t.val_batches)

    config = to_container(cfg)
    config["env"] = env
    config["precision_resolved"] = precision
    asked = patch_words(cfg.accel.patch, cfg.accel.loss_form)
    patch = "" if asked == DEFAULT_PATCH else f"[{asked.replace(' + ', '+').replace(' ', '-')}]"
    run_name = f"{label.replace(' + compiled model', '+compile')}{patch}-{cfg.model.name}"
    wandb_id = ((previous or {}).get("wandb") or {}).get("id")
    logger = make_logger(cfg.logger, run_dir, run_name, group, config, wandb_id=wandb_id, resuming=previous is not None)
    if rank_zero_only.rank == 0 and previous is None:
        # a run killed outright leaves this behind: enough to resume it from its last checkpoint
        wid = logger.experiment.id if cfg.logger.name == "wandb" else None
        write_json(run_dir / "results.json", running_record(cfg, config, run_dir, applied.as_dict(), wid))

    monitor = ThroughputMonitor(
        tokens_per_step=tokens_per_step(cfg), samples_per_step=int(cfg.data.batch_size),  # per rank
        flops_per_token=model.flops_per_token(seq), warmup_steps=t.warmup_steps, window=t.window,
        peak_flops=peak_bf16_flops(env["device_name"]) if gpu else None,
    )
    callbacks, graceful, guard = _callbacks(cfg, run_dir, monitor, extra_callbacks)
    val_every = t.val_every or t.max_steps
    trainer = L.Trainer(
        accelerator="gpu" if gpu else "cpu", devices=t.devices, num_nodes=t.num_nodes, strategy=t.strategy,
        precision=precision, max_steps=t.max_steps, val_check_interval=val_every, check_val_every_n_epoch=None,
        limit_val_batches=t.val_batches, num_sanity_val_steps=0, log_every_n_steps=t.window,
        logger=logger if logger is not None else False, callbacks=callbacks,
        enable_checkpointing=bool(t.ckpt_every),  # GracefulStop saves on its own
        enable_model_summary=False, default_root_dir=str(run_dir),
    )
    failure: Optional[BaseException] = None
    try:
        trainer.fit(task, datamodule=dm, ckpt_path=str(run_dir / "checkpoints" / "last.ckpt") if previous else None)
        if t.max_steps % val_every and not graceful.requested:
            trainer.validate(task, datamodule=dm, verbose=False)
    except NonFiniteLossError as exc:
        failure = exc
    status = ("failed" if failure is not None else "interrupted" if graceful.requested
              else "nonfinite" if guard.event is not None else "completed")

    summary = monitor.summary()
    curve = task.loss_curve()
    results = final_record(
        cfg, status=status, failure=failure, guard_event=guard.event, stopped_by=graceful.requested,
        steps_done=trainer.global_step, previous=previous, applied=applied.as_dict(),
        exact=all(m.exact for m in methods),
        config=config, env=env, device=device, precision=precision, world_size=trainer.world_size,
        tokens_per_step=tokens_per_step(cfg), checksums=task.first_batch_checksums(),
        flops_per_token=model.flops_per_token(seq), prepared=prepared, gate=gate_info, summary=summary.as_dict(),
        curve=curve, val_loss=trainer.callback_metrics.get("val/loss"), run_dir=run_dir,
    )
    if logger is not None and cfg.logger.name == "wandb" and rank_zero_only.rank == 0:
        run = logger.experiment
        results["wandb"] = {"id": run.id, "dir": str(Path(run.dir).parent), "mode": wandb_mode(cfg.logger.mode)}
        run.summary.update({k: v for k, v in results.items() if isinstance(v, (int, float, str)) and v is not None})
    if trainer.is_global_zero:
        write_json(run_dir / "results.json", results)
    if logger is not None and cfg.logger.name == "wandb":
        import wandb

        wandb.finish(exit_code=0 if status in ("completed", "interrupted") else 1)
    _release_process_group()
    if failure is not None:
        raise failure
    if graceful.requested:
        console.print(f"[bold]harness[/]: stopped at step {trainer.global_step} ({graceful.requested}); "
                      f"continue with: python -m harness.train resume={escape(str(run_dir))}")
    console.print(done_message(results, label, device, summary, run_dir, cfg.logger.name))
    return results


def _release_process_group() -> None:
    """Tear down a distributed run's process group here rather than at interpreter exit, where a gloo
    group's threads were seen to abort the process after a finished CPU DDP run (1 run in 8 here:
    "terminate called without an active exception", exit 134)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def done_message(results: dict, label: str, device: str, summary, run_dir: Path, logger_name: str) -> str:
    """The end-of-run lines: the throughput, the final loss, where the results are and how to see the
    metrics (the offline W&B run's ``wandb sync`` command, or the CSV file)."""
    from rich.markup import escape

    from harness.stats import NOISY_SPREAD

    tps = f"{summary.tokens_per_s:,.0f}" if summary.tokens_per_s else "n/a"
    windows = f"{summary.windows} window" + ("" if summary.windows == 1 else "s")
    loss = results.get("final_train_loss")
    loss_text = f"{loss:.4f}" if isinstance(loss, float) else str(loss)
    noisy = (f", NOISY: step p90/p50 {summary.step_ms_spread:.2f} > {NOISY_SPREAD:.2f}, something else ran on the "
             "machine or the clocks moved" if getattr(summary, "noisy", False) else "")
    lines = [f"[bold]harness[/]: done: accel={escape(label)} on {escape(device)}: {tps} tokens/s (median of "
             f"{windows}{noisy}), warm-up {summary.warmup_s or 0:.1f}s, final loss {loss_text}",
             f"  results: {escape(str(run_dir / 'results.json'))}"]
    trainer = (results.get("config") or {}).get("trainer") or {}
    if not summary.tokens_per_s and not results.get("stopped_by") and {"warmup_steps", "window"} <= set(trainer):
        need = max(1, trainer["window"] // 2)  # (throughput.py: a last window of fewer steps is not counted)
        lines.insert(1, f"  no throughput: {results.get('steps_done', '?')} steps, the first {trainer['warmup_steps']} "
                        f"of them warm-up, and a window counts from {need} timed steps (trainer.window="
                        f"{trainer['window']}): run trainer.max_steps >= {trainer['warmup_steps'] + need}")
    wb = results.get("wandb") or {}
    if logger_name == "wandb" and wb:
        runs = sorted(Path(run_dir, "wandb").glob(f"offline-run-*-{wb.get('id')}")) if wb.get("mode") == "offline" else []
        if runs:
            lines.append(f"  W&B (offline): upload with `wandb sync {escape(' '.join(str(r) for r in runs))}`, "
                         f"or look at it here with `wandb leet {escape(str(runs[-1]))}`")
        elif wb.get("mode") == "online":
            lines.append(f"  W&B: run {wb.get('id')} in project {results['config']['logger']['project']}")
    elif logger_name == "csv":
        lines.append(f"  metrics: {escape(str(run_dir / 'csv' / 'metrics.csv'))}")
    return "\n".join(lines)


def validate_with_data(cfg: DictConfig) -> None:
    """Config ranges plus the cheap data checks (a missing text file) that need no corpus build, and
    whether the method can run on this machine."""
    validate(cfg)
    if cfg.data.name == "text" and not Path(str(cfg.data.path)).expanduser().is_file():
        from harness.data import DataError

        raise DataError(f"data.path={cfg.data.path!r}: no such file (data=text needs an existing text file)")
    a = cfg.accel
    msg = method_unavailable_message(str(a.name), str(a.method), dict(a.options or {}), a.get("loss_method"),
                                     list(a.patch))
    if msg:
        raise UsageError(msg)
    from harness.accel import check_accel

    check_accel(str(a.method), list(a.patch), str(a.loss_form), a.get("loss_method"))  # AccelError: exit 2, no directory


def _user_error(exc: BaseException) -> bool:
    """A mistake in what the user asked for (said in one paragraph), not a failure of the run."""
    import kernels
    from harness.accel import AccelError
    from harness.config import ConfigError
    from harness.data import DataError
    from harness.resume import ResumeError

    return isinstance(exc, (AccelError, ConfigError, DataError, UsageError, ResumeError, OutputDirError,
                            kernels.MethodUnavailableError, kernels.UnknownMethodError))


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def hydra_main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from harness.resume import load_resume, override_value, record_failure

    hc = HydraConfig.get()
    previous = None
    run_dir = Path(hc.runtime.output_dir)
    single = hc.mode != RunMode.MULTIRUN
    if cfg.resume:
        more = override_value(list(hc.overrides.task), "trainer.max_steps")
        try:
            cfg, previous = load_resume(Path(cfg.resume), int(more) if more is not None else None)
        except Exception as exc:
            if single and (_user_error(exc) or isinstance(exc, FileNotFoundError)):
                fail(str(exc))
            raise
        run_dir = Path(cfg.resume)
        done = previous.get("steps_done")
        what = (f"extending it to {cfg.trainer.max_steps} steps" if previous.get("status") in ("completed", "nonfinite")
                else f"continuing its {previous.get('status')} run" + (f" (stopped at step {done})" if done else ""))
        print(f"harness: resuming {run_dir} from checkpoints/last.ckpt with its saved config, {what}",
              file=sys.stderr)
    group = cfg.logger.group
    if group is None and hc.mode == RunMode.MULTIRUN:
        group = Path(hc.sweep.dir).name
    if hc.mode == RunMode.MULTIRUN and _distributed(cfg):
        # Lightning's DDP starts the other ranks by re-running this command line, which in a sweep
        # would re-run the whole sweep: run each job as its own single run in its own job directory
        _run_job_in_subprocess(list(hc.overrides.task), run_dir, group)
        return
    try:
        run_training(cfg, run_dir, group=group, previous=previous)
    except Exception as exc:
        # a sweep goes on past a failed job (Hydra reports it at the end); its results.json says why
        record_failure(run_dir, cfg, exc)
        if single and _user_error(exc):
            fail(str(exc))  # one paragraph, exit status 2, no traceback
        raise


def _distributed(cfg: DictConfig) -> bool:
    devices = str(cfg.trainer.devices)
    return int(cfg.trainer.num_nodes) > 1 or (devices.isdigit() and int(devices) > 1) or devices in ("-1", "auto")


def _run_job_in_subprocess(overrides: list[str], run_dir: Path, group: str) -> None:
    import subprocess

    cmd = [sys.executable, "-m", "harness.train", *overrides, f"logger.group={group}", f"hydra.run.dir={run_dir}"]
    subprocess.run(cmd, check=True, cwd=os.getcwd())


def main() -> None:
    from harness.resume import resume_command_line, resume_request
    from harness.cli import split_argv

    argv = sys.argv[1:]
    if not wants_help(argv) and resume_request(split_argv(argv)[1]):
        # into the run's own directory, checked first: a finished run is left untouched (exit 0)
        sys.argv[1:] = resume_command_line(argv)
        hydra_main()
        return
    run_app(hydra_main, "config", validate_with_data)


if __name__ == "__main__":
    main()
