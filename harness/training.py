"""One training run, step by step: ``run_training`` (what ``python -m harness.train`` and each run of a
study call) reads as its steps: prepare the methods, build the model and gate every op it patched
against float64 (harness.gate), set up the task, the logger and the trainer, fit, and write the
results (harness.results).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig
from rich.markup import escape

import kernels
from harness.build import Built, build, compute_dtype, data_seed, on_gpu, resolve_precision, seq_len, tokens_per_step
from harness.config import DEFAULT_PATCH, accel_methods, patch_words, to_container, validate
from harness.console import RunConsole, done_message, quiet_third_party
from harness.progress import progress_callback
from harness.env import environment
from harness.fallback import with_compiled_fallback
from harness.gate import RunShapes, run_gate
from harness.loggers import make_logger, wandb_mode
from harness.memory import check_step_memory
from harness.outcomes import Interrupted, NonFiniteLossError, OutputDirError, StopNow
from harness.reliability import GracefulStop, NonFiniteLossGuard, stopped_message
from harness.results import final_record, running_record, write_json
from harness.resume import record_failure
from harness.task import LanguageModelTask, TokenDataModule
from harness.throughput import ThroughputMonitor, peak_bf16_flops


@dataclass
class Run:
    """One training run as its steps set it up."""

    cfg: DictConfig
    run_dir: Path
    previous: Optional[dict]  # the results of the run this one resumes
    console: RunConsole
    gpu: bool
    precision: str
    methods: list = field(default_factory=list)  # the kernels methods it runs (accel.method, accel.loss_method)
    prepared: dict = field(default_factory=dict)  # what their prepare() reported
    built: Optional[Built] = None
    gate: dict = field(default_factory=dict)  # the correctness gate's result
    env: dict = field(default_factory=dict)
    device: str = ""
    label: str = ""  # accel name (+ compiled model)
    config: dict = field(default_factory=dict)  # the config as results.json and W&B record it


def run_training(
    cfg: DictConfig,
    run_dir: Path,
    group: Optional[str] = None,
    extra_callbacks: tuple = (),
    previous: Optional[dict] = None,
    resume_hint: bool = True,
) -> dict[str, Any]:
    """Train once with a composed config; returns (and writes to run_dir/results.json) the results.

    ``previous``: the results of the interrupted run that ``run_dir`` holds, to resume it from its
    ``checkpoints/last.ckpt`` (same W&B run id, same data position, one results.json for the whole run).
    ``resume_hint``: after a stop by a signal, print the command that resumes this run (a study says
    its own). A second signal before the first step raises :class:`Interrupted`, the run marked so.
    """
    validate(cfg)
    cfg, fallback = with_compiled_fallback(cfg)  # accel.compiled_loss_method under compile_model=true
    too_close = check_step_memory(cfg, on_gpu(cfg))  # MemoryEstimateError before any directory or work
    run = start_run(cfg, run_dir, previous)
    if fallback:
        run.console.print(f"[yellow]harness: accel={escape(str(cfg.accel.name))}: {escape(fallback)}[/]")
    if too_close:
        run.console.print(f"[yellow]harness: warning: {escape(too_close)}[/]")
    graceful = GracefulStop(run.run_dir / "checkpoints", say=run.console.print)
    graceful.install()  # from here on, Ctrl+C stops the run, recorded, rather than killing it unrecorded
    try:
        return _train(run, graceful, group, extra_callbacks, resume_hint)
    except StopNow:  # a second signal before the trainer ran: nothing trained, nothing to resume
        record_failure(run.run_dir, cfg, Interrupted(f"{graceful.requested} before the first step"))
        raise Interrupted(f"run {run.run_dir} interrupted ({graceful.requested}) before its first step") from None
    finally:
        graceful.restore_handlers()


def _train(run: Run, graceful: GracefulStop, group: Optional[str], extra_callbacks: tuple,
           resume_hint: bool) -> dict[str, Any]:
    cfg = run.cfg
    prepare_methods(run)
    build_and_gate(run)
    announce(run)
    task, dm = task_and_data(run)
    logger = open_logger(run, group)
    monitor = throughput_monitor(run)
    callbacks, guard = _callbacks(cfg, run.run_dir, monitor, graceful, extra_callbacks,
                                  loss_computed=all(m.exact for m in run.methods))
    trainer = make_trainer(run, logger, callbacks)
    failure = fit(run, trainer, task, dm, graceful)
    status = ("failed" if failure is not None else "interrupted" if graceful.requested
              else "nonfinite" if guard.event is not None else "completed")
    summary = monitor.summary()
    results = record_results(run, status, failure, trainer, task, summary, graceful, guard)
    finish_run(run, logger, trainer, results, status)
    _release_process_group()
    if failure is not None:
        raise failure
    if graceful.requested and resume_hint:
        run.console.print(stopped_message(run.run_dir, trainer.global_step, graceful.requested))
    run.console.print(done_message(results, run.label, run.device, summary, run.run_dir, cfg.logger.name))
    return results


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
    # Lightning prints through its own handlers; under Hydra the root logger prints (and files) it too.
    # Imported before Hydra set up logging (as it is, at the top of this module), Lightning also stops its
    # loggers from propagating to the root logger: let them, or its lines never reach the run's log file
    if logging.getLogger().hasHandlers():
        for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
            logging.getLogger(name).handlers.clear()
            logging.getLogger(name).propagate = True


def start_run(cfg: DictConfig, run_dir: Path, previous: Optional[dict]) -> Run:
    """Quiet third-party output, the run's console and directory, its device and precision."""
    _quiet_lightning_handlers()
    quiet_third_party(resuming=previous is not None)
    console = RunConsole(quiet=rank_zero_only.rank != 0)  # one voice in a distributed run
    run_dir = prepare_run_dir(run_dir)
    gpu = on_gpu(cfg)
    return Run(cfg, run_dir, previous, console, gpu, resolve_precision(str(cfg.trainer.precision), gpu))


def prepare_methods(run: Run) -> None:
    """The run's methods (unknown / not runnable here: fail before any work, the loss's own method too,
    accel.loss_method), each prepared once (e.g. the CUDA extension built: timed apart, reported)."""
    cfg = run.cfg
    run.methods = [kernels.get_method(n) for n, _ in accel_methods(cfg.accel.method, cfg.accel.get("loss_method"),
                                                                     patch=list(cfg.accel.patch))]
    for i, method in enumerate(run.methods):
        if method.prepare is not None:
            done = method.prepare()
            if i:
                run.prepared["loss_method"] = done
            else:
                run.prepared = dict(done)
            run.console.print(f"[bold]harness[/]: prepared method {method.name!r}: {done}")


def build_and_gate(run: Run) -> None:
    """The seeded model with the method applied, every op it patched checked against float64."""
    L.seed_everything(run.cfg.seed, workers=True, verbose=False)
    run.built = build(run.cfg)
    run.gate = _gate(run.cfg, run.built, run.gpu, run.precision, run.console)
    if run.gpu:
        torch.cuda.reset_peak_memory_stats()


def _gate(cfg: DictConfig, built, gpu: bool, precision: str, console) -> dict:
    if not cfg.check_kernel:
        return {"checked": False, "reason": "switched off (check_kernel=false)"}
    c = built.model.config
    shapes = RunShapes(heads=c.n_head, kv_heads=getattr(c, "n_kv_head", 0) or 0, seq_len=seq_len(cfg),
                       head_dim=getattr(c, "head_dim", c.n_embd // c.n_head), vocab=c.vocab_size,
                       n_embd=c.n_embd, tokens=int(cfg.data.batch_size) * seq_len(cfg),
                       dtype=compute_dtype(precision), device="cuda" if gpu else "cpu")
    info = run_gate(built.applied, shapes)
    if info.get("checked"):
        for chk in info["checks"]:
            console.print(f"[bold]harness[/]: correctness gate passed for {chk['method']!r} {chk['op']} on "
                          f"{tuple(chk['shape'])} {chk['dtype']} (forward error {chk['fwd_error']:.1e}, backward "
                          f"{chk['bwd_error']:.1e})")
    return info


def announce(run: Run) -> None:
    """The run's line: method (and what it patched), model, data, device, precision, directory."""
    cfg, model = run.cfg, run.built.model
    run.env = environment()
    run.device = run.env["device_name"] if run.gpu else "CPU"
    run.label = f"{cfg.accel.name}" + (" + compiled model" if cfg.compile_model else "")
    run.console.print(
        f"[bold]harness[/]: accel=[cyan]{run.label}[/] ({run.built.applied.describe()}) model={cfg.model.name} "
        f"({model.matmul_params() / 1e6:.1f}M matmul params) data={cfg.data.name} on [green]{run.device}[/] "
        f"precision={run.precision} -> {escape(str(run.run_dir))}"
    )
    if not run.gpu and not str(cfg.model.name).endswith("tiny"):  # tiny, llama_tiny, hf_*_tiny
        run.console.print("[yellow]no CUDA GPU here: this model will train slowly on the CPU; for a quick CPU run "
                          "use model=tiny (or llama_tiny) trainer=cpu[/]")


def task_and_data(run: Run) -> tuple[LanguageModelTask, TokenDataModule]:
    """The Lightning task (optimizer, schedule, compile) and the batches."""
    cfg, t, model = run.cfg, run.cfg.trainer, run.built.model
    task = LanguageModelTask(
        model, lr=t.lr, weight_decay=t.weight_decay, betas=(t.beta1, t.beta2), max_steps=t.lr_decay_steps or t.max_steps,
        lr_warmup_steps=t.lr_warmup_steps, min_lr_ratio=t.min_lr_ratio, compile_model=cfg.compile_model,
        compile_mode=cfg.compile_mode, grad_clip=float(t.grad_clip or 0.0), fused_optimizer=run.precision != "16-mixed",
    )
    dm = TokenDataModule(run.built.corpus, model.config.vocab_size, int(cfg.data.batch_size), seq_len(cfg),
                         data_seed(cfg), t.max_steps, t.val_batches)
    return task, dm


def open_logger(run: Run, group: Optional[str]):
    """The run's logger (W&B, CSV or none; a resumed run continues its W&B run); before training, a
    'running' results.json: enough to resume the run if it is killed outright."""
    cfg, previous = run.cfg, run.previous
    run.config = to_container(cfg)
    run.config["env"] = run.env
    run.config["precision_resolved"] = run.precision
    asked = patch_words(cfg.accel.patch, cfg.accel.loss_form)
    patch = "" if asked == DEFAULT_PATCH else f"[{asked.replace(' + ', '+').replace(' ', '-')}]"
    run_name = f"{run.label.replace(' + compiled model', '+compile')}{patch}-{cfg.model.name}"
    wandb_id = ((previous or {}).get("wandb") or {}).get("id")
    logger = make_logger(cfg.logger, run.run_dir, run_name, group, run.config, wandb_id=wandb_id,
                         resuming=previous is not None)
    if rank_zero_only.rank == 0 and previous is None:
        wid = logger.experiment.id if cfg.logger.name == "wandb" else None
        write_json(run.run_dir / "results.json",
                   running_record(cfg, run.config, run.run_dir, run.built.applied.as_dict(), wid))
    return logger


def throughput_monitor(run: Run) -> ThroughputMonitor:
    t, model = run.cfg.trainer, run.built.model
    return ThroughputMonitor(
        tokens_per_step=tokens_per_step(run.cfg), samples_per_step=int(run.cfg.data.batch_size),  # per rank
        flops_per_token=model.flops_per_token(seq_len(run.cfg)), warmup_steps=t.warmup_steps, window=t.window,
        peak_flops=peak_bf16_flops(run.env["device_name"]) if run.gpu else None,
    )


def _callbacks(cfg: DictConfig, run_dir: Path, monitor, graceful: GracefulStop, extra: tuple,
               loss_computed: bool = True):
    guard = NonFiniteLossGuard(cfg.trainer.window, cfg.accel.name, cfg.trainer.on_nonfinite)
    callbacks: list = [monitor, guard, graceful, progress_callback(cfg.trainer.window, loss_computed),
                       *extra]
    if cfg.trainer.ckpt_every:
        callbacks.append(ModelCheckpoint(
            dirpath=str(run_dir / "checkpoints"), filename="step{step}", every_n_train_steps=cfg.trainer.ckpt_every,
            save_last=True, save_top_k=1, auto_insert_metric_name=False,
        ))
    return callbacks, guard


def make_trainer(run: Run, logger, callbacks: list) -> L.Trainer:
    t = run.cfg.trainer
    return L.Trainer(
        accelerator="gpu" if run.gpu else "cpu", devices=t.devices, num_nodes=t.num_nodes, strategy=t.strategy,
        precision=run.precision, max_steps=t.max_steps, val_check_interval=_val_every(run.cfg),
        check_val_every_n_epoch=None, limit_val_batches=t.val_batches, num_sanity_val_steps=0,
        log_every_n_steps=t.window, logger=logger if logger is not None else False, callbacks=callbacks,
        enable_checkpointing=bool(t.ckpt_every),  # GracefulStop saves on its own
        enable_model_summary=False, default_root_dir=str(run.run_dir),
    )


def _val_every(cfg: DictConfig) -> int:
    return cfg.trainer.val_every or cfg.trainer.max_steps


def fit(run: Run, trainer: L.Trainer, task, dm, graceful: GracefulStop) -> Optional[BaseException]:
    """Train (from the last checkpoint when resuming), then validate at the end unless the last step
    did or a signal stopped it; a non-finite loss that stops the run is returned, not raised."""
    ckpt = str(run.run_dir / "checkpoints" / "last.ckpt") if run.previous else None
    try:
        trainer.fit(task, datamodule=dm, ckpt_path=ckpt)
        if run.cfg.trainer.max_steps % _val_every(run.cfg) and not graceful.requested:
            trainer.validate(task, datamodule=dm, verbose=False)
    except NonFiniteLossError as exc:
        return exc
    except StopNow:
        pass  # a second signal: the run records itself as interrupted at the step it reached
    return None


def record_results(run: Run, status: str, failure, trainer: L.Trainer, task, summary, graceful, guard) -> dict:
    """The run's results record (harness.results.final_record)."""
    cfg, model = run.cfg, run.built.model
    curve = task.loss_curve()
    return final_record(
        cfg, status=status, failure=failure, guard_event=guard.event, stopped_by=graceful.requested,
        steps_done=trainer.global_step, previous=run.previous, applied=run.built.applied.as_dict(),
        exact=all(m.exact for m in run.methods),
        config=run.config, env=run.env, device=run.device, precision=run.precision, world_size=trainer.world_size,
        tokens_per_step=tokens_per_step(cfg), checksums=task.first_batch_checksums(),
        flops_per_token=model.flops_per_token(seq_len(cfg)), prepared=run.prepared, gate=run.gate,
        summary=summary.as_dict(), curve=curve, val_loss=trainer.callback_metrics.get("val/loss"), run_dir=run.run_dir,
    )


def finish_run(run: Run, logger, trainer: L.Trainer, results: dict, status: str) -> None:
    """The W&B run's id and summary in the results, results.json written (rank 0), the W&B run finished."""
    cfg = run.cfg
    if logger is not None and cfg.logger.name == "wandb" and rank_zero_only.rank == 0:
        wb = logger.experiment
        results["wandb"] = {"id": wb.id, "dir": str(Path(wb.dir).parent), "mode": wandb_mode(cfg.logger.mode)}
        wb.summary.update({k: v for k, v in results.items() if isinstance(v, (int, float, str)) and v is not None})
    if trainer.is_global_zero:
        write_json(run.run_dir / "results.json", results)
    if logger is not None and cfg.logger.name == "wandb":
        import wandb  # here: a heavy import that only logger=wandb needs

        wandb.finish(exit_code=0 if status in ("completed", "interrupted") else 1)


def _release_process_group() -> None:
    """Tear down a distributed run's process group here rather than at interpreter exit, where a gloo
    group's threads were seen to abort the process after a finished CPU DDP run (1 run in 8 here:
    "terminate called without an active exception", exit 134)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
