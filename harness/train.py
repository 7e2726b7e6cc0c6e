"""Training entry point: ``python -m harness.train [group=option ...] [key=value ...]`` (or ``harness-train``).

A Hydra app (``--help`` lists the config groups and their options). It builds the model, applies the
acceleration method chosen by ``accel=...``, trains it with Lightning, logs throughput to W&B (offline
by default) and writes ``results.json`` into the run directory.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any, Optional

import hydra
from omegaconf import DictConfig

from harness.cli import precheck_overrides
from harness.config import validate  # also registers the structured-config schema

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")


class GateError(RuntimeError):
    """The method's softmax failed its correctness check: no training, no numbers."""


def resolve_precision(requested: str, on_gpu: bool) -> str:
    if requested != "auto":
        return requested
    import torch

    if on_gpu and torch.cuda.is_bf16_supported():
        return "bf16-mixed"
    return "32-true"


def wandb_mode(requested: str) -> str:
    """auto: WANDB_MODE if set, online if an API key is configured, else offline."""
    if requested != "auto":
        return requested
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        if "api.wandb.ai" in netrc.read_text():
            return "online"
    except OSError:
        pass
    return "offline"


def make_logger(
    cfg: DictConfig, run_dir: Path, run_name: str, group: Optional[str], config: dict, wandb_id: Optional[str] = None
):
    name = cfg.logger.name
    if name == "none":
        return None
    if name == "csv":
        from lightning.pytorch.loggers import CSVLogger

        return CSVLogger(save_dir=str(run_dir), name="csv", version="")
    from harness.loggers import ResumableWandbLogger, last_logged_step

    return ResumableWandbLogger(
        progress_dir=run_dir,
        skip_through_step=last_logged_step(run_dir) if wandb_id else None,
        project=cfg.logger.project,
        name=run_name,
        group=group,
        save_dir=str(run_dir),
        dir=str(run_dir),
        mode=wandb_mode(cfg.logger.mode),
        tags=list(cfg.logger.tags) or None,
        config=config,
        job_type="train",
        **({"id": wandb_id, "resume": "allow"} if wandb_id else {}),
    )


class OutputDirError(OSError):
    """The run directory cannot be created or written."""


def load_resume(run_dir: Path) -> tuple[DictConfig, dict]:
    """The config and results of an interrupted run directory, to continue it where it stopped."""
    from omegaconf import OmegaConf

    from harness.config import TrainConfig
    from harness.results import read_json

    run_dir = Path(run_dir)
    results_path, ckpt = run_dir / "results.json", run_dir / "checkpoints" / "last.ckpt"
    if not results_path.is_file():
        raise FileNotFoundError(f"resume={run_dir}: no results.json there, so it is not a harness run directory")
    if not ckpt.is_file():
        have = sorted(p.name for p in (run_dir / "checkpoints").glob("*")) if (run_dir / "checkpoints").is_dir() else []
        raise FileNotFoundError(
            f"resume={run_dir}: no checkpoints/last.ckpt to resume from (found: {', '.join(have) or 'nothing'}); "
            "runs save one on a graceful stop and every trainer.ckpt_every steps"
        )
    previous = read_json(results_path)
    saved = {k: v for k, v in previous["config"].items() if k not in ("env", "precision_resolved")}
    cfg = OmegaConf.merge(OmegaConf.structured(TrainConfig), saved)
    cfg.resume = str(run_dir)
    return cfg, previous


def build_model(cfg: DictConfig):
    """The GPT a config describes (vocabulary from the data unless model.vocab_size is set)."""
    from harness.data import data_vocab_size
    from models import GPT, GPTConfig

    gcfg = GPTConfig(
        vocab_size=int(cfg.model.vocab_size or data_vocab_size(cfg.data)),
        block_size=int(cfg.model.context),
        n_layer=int(cfg.model.n_layer),
        n_head=int(cfg.model.n_head),
        n_embd=int(cfg.model.n_embd),
        dropout=float(cfg.model.dropout),
        bias=bool(cfg.model.bias),
    )
    return GPT(gcfg)


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
    from lightning.pytorch.callbacks import ModelCheckpoint, TQDMProgressBar
    from rich.console import Console

    import kernels
    from harness.config import to_container
    from harness.data import make_corpus
    from harness.env import environment
    from harness.methods import apply_accel
    from harness.reliability import GracefulStop, NonFiniteLossError, NonFiniteLossGuard
    from harness.results import write_json
    from harness.task import LanguageModelTask, TokenDataModule
    from harness.throughput import ThroughputMonitor, peak_bf16_flops
    validate(cfg)
    # Lightning prints through its own handlers; under Hydra the root logger prints (and files) it too
    if logging.getLogger().hasHandlers():
        for name in ("lightning", "lightning.pytorch"):
            logging.getLogger(name).handlers.clear()
    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    console = Console(stderr=True, quiet=rank_zero_only.rank != 0)  # one voice in a distributed run
    run_dir = Path(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise OutputDirError(f"cannot write the output directory {run_dir}: {exc.strerror or exc}") from exc

    want_gpu = cfg.trainer.accelerator in ("auto", "gpu", "cuda")
    on_gpu = want_gpu and torch.cuda.is_available()
    if cfg.trainer.accelerator in ("gpu", "cuda") and not on_gpu:
        raise RuntimeError("trainer.accelerator=gpu but no CUDA GPU is available here (use auto or cpu)")
    precision = resolve_precision(str(cfg.trainer.precision), on_gpu)
    prepared: dict = {}
    if cfg.accel.softmax:
        method = kernels.get_method(cfg.accel.softmax)  # unknown / not runnable here: fail before work
        if method.prepare is not None:  # e.g. build the CUDA extension: timed apart, reported
            prepared = method.prepare()
            console.print(f"[bold]harness[/]: prepared softmax method {method.name!r}: {prepared}")

    seq_len = int(cfg.data.seq_len or cfg.model.context)
    gate_info: dict = {"checked": False, "reason": "switched off (check_kernel=false)"}
    if cfg.accel.softmax and cfg.check_kernel:
        if kernels.get_method(cfg.accel.softmax).exact:
            from harness.gate import check_softmax

            dtype = {"bf16": torch.bfloat16, "16": torch.float16}.get(precision.split("-")[0], torch.float32)
            gate = check_softmax(
                cfg.accel.softmax, (1, int(cfg.model.n_head), seq_len, seq_len), dtype, "cuda" if on_gpu else "cpu",
                scale=(int(cfg.model.n_embd) // int(cfg.model.n_head)) ** -0.5, causal=True,
            )
            gate_info = {"checked": True, **gate.as_dict()}
            if not gate.passed:
                raise GateError(
                    f"softmax method {cfg.accel.softmax!r} failed its correctness check against float64 on "
                    f"shape {gate.shape} {gate.dtype}: {gate.reason}. Refusing to train (check_kernel=false "
                    "skips the check, and is recorded in the results)."
                )
            console.print(
                f"[bold]harness[/]: correctness gate passed for {cfg.accel.softmax!r} on {gate.shape} {gate.dtype} "
                f"(forward error {gate.fwd_error:.1e}, backward {gate.bwd_error:.1e})"
            )
        else:
            gate_info = {"checked": False, "reason": "timing-only method (not a softmax)"}
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()

    L.seed_everything(cfg.seed, workers=True, verbose=False)
    corpus = make_corpus(cfg.data, seq_len)
    model = build_model(cfg)
    vocab = model.config.vocab_size
    apply_accel(model, cfg.accel.attention, cfg.accel.softmax, dropout=model.config.dropout)

    env = environment()
    device = env["device_name"] if on_gpu else "CPU"
    label = f"{cfg.accel.name}" + (" + compiled model" if cfg.compile_model else "")
    console.print(
        f"[bold]harness[/]: accel=[cyan]{label}[/] (attention={cfg.accel.attention}, "
        f"softmax={cfg.accel.softmax}) model={cfg.model.name} ({model.matmul_params() / 1e6:.1f}M matmul "
        f"params) data={cfg.data.name} on [green]{device}[/] precision={precision} -> {run_dir}"
    )
    if not on_gpu and cfg.model.name != "tiny":
        console.print(
            "[yellow]no CUDA GPU here: this model will train slowly on the CPU; for a quick CPU run use "
            "model=tiny trainer=cpu[/]"
        )

    task = LanguageModelTask(
        model,
        lr=cfg.trainer.lr,
        weight_decay=cfg.trainer.weight_decay,
        betas=(cfg.trainer.beta1, cfg.trainer.beta2),
        max_steps=cfg.trainer.max_steps,
        lr_warmup_steps=cfg.trainer.lr_warmup_steps,
        min_lr_ratio=cfg.trainer.min_lr_ratio,
        compile_model=cfg.compile_model,
        compile_mode=cfg.compile_mode,
        grad_clip=float(cfg.trainer.grad_clip or 0.0),
        fused_optimizer=precision != "16-mixed",
    )
    dm = TokenDataModule(
        corpus, vocab, int(cfg.model.batch_size), seq_len, cfg.seed, cfg.trainer.max_steps,
        cfg.trainer.val_batches,
    )

    config = to_container(cfg)
    config["env"] = env
    config["precision_resolved"] = precision
    run_name = f"{label.replace(' + compiled model', '+compile')}-{cfg.model.name}"
    wandb_id = ((previous or {}).get("wandb") or {}).get("id")
    logger = make_logger(cfg, run_dir, run_name, group, config, wandb_id=wandb_id)
    if rank_zero_only.rank == 0 and previous is None:
        # a run killed outright leaves this behind: enough to resume it from its last checkpoint
        write_json(run_dir / "results.json", {
            "status": "running", "method": cfg.accel.name, "compile_model": bool(cfg.compile_model),
            "model": config["model"], "data": config["data"], "run_dir": str(run_dir), "config": config,
            "wandb": {"id": logger.experiment.id} if cfg.logger.name == "wandb" else None,
        })

    monitor = ThroughputMonitor(
        tokens_per_step=int(cfg.model.batch_size) * seq_len,  # per rank
        samples_per_step=int(cfg.model.batch_size),
        flops_per_token=model.flops_per_token(seq_len),
        warmup_steps=cfg.trainer.warmup_steps,
        window=cfg.trainer.window,
        peak_flops=peak_bf16_flops(env["device_name"]) if on_gpu else None,
    )
    graceful = GracefulStop(run_dir / "checkpoints")
    guard = NonFiniteLossGuard(cfg.trainer.window, cfg.accel.name, cfg.trainer.on_nonfinite)
    callbacks: list = [monitor, guard, graceful, TQDMProgressBar(refresh_rate=cfg.trainer.window), *extra_callbacks]
    if cfg.trainer.ckpt_every:
        callbacks.append(
            ModelCheckpoint(
                dirpath=str(run_dir / "checkpoints"), filename="step{step}", every_n_train_steps=cfg.trainer.ckpt_every,
                save_last=True, save_top_k=1, auto_insert_metric_name=False,
            )
        )
    val_every = cfg.trainer.val_every or cfg.trainer.max_steps
    trainer = L.Trainer(
        accelerator="gpu" if on_gpu else "cpu",
        devices=cfg.trainer.devices,
        num_nodes=cfg.trainer.num_nodes,
        strategy=cfg.trainer.strategy,
        precision=precision,
        max_steps=cfg.trainer.max_steps,
        val_check_interval=val_every,
        check_val_every_n_epoch=None,
        limit_val_batches=cfg.trainer.val_batches,
        num_sanity_val_steps=0,
        log_every_n_steps=cfg.trainer.window,
        logger=logger if logger is not None else False,
        callbacks=callbacks,
        enable_checkpointing=bool(cfg.trainer.ckpt_every),  # GracefulStop saves on its own
        enable_model_summary=False,
        default_root_dir=str(run_dir),
    )
    ckpt_path = str(run_dir / "checkpoints" / "last.ckpt") if previous else None
    failure: Optional[BaseException] = None
    try:
        trainer.fit(task, datamodule=dm, ckpt_path=ckpt_path)
        if cfg.trainer.max_steps % val_every and not graceful.requested:
            trainer.validate(task, datamodule=dm, verbose=False)
    except NonFiniteLossError as exc:
        failure = exc
    status = "completed"
    if failure is not None:
        status = "failed"
    elif graceful.requested:
        status = "interrupted"
    elif guard.event is not None:
        status = "nonfinite"

    summary = monitor.summary()
    curve = task.loss_curve()
    val_loss = trainer.callback_metrics.get("val/loss")
    results: dict[str, Any] = {
        "status": status,
        "error": str(failure) if failure else None,
        "nonfinite_loss": guard.event,
        "stopped_by": graceful.requested,
        "steps_done": trainer.global_step,
        "resumed": bool(previous),
        "segments": ((previous or {}).get("segments") or 1) + (1 if previous else 0),
        "method": cfg.accel.name,
        "attention": cfg.accel.attention,
        "softmax": cfg.accel.softmax,
        "compile_model": bool(cfg.compile_model),
        "model": config["model"],
        "data": config["data"],
        "seed": cfg.seed,
        "device": device,
        "precision": precision,
        "world_size": trainer.world_size,
        "tokens_per_step": int(cfg.model.batch_size) * seq_len * trainer.world_size,
        "rank_first_batch_checksums": task.first_batch_checksums(),
        "flops_per_token": model.flops_per_token(seq_len),
        "method_prepare": prepared,
        "gate": gate_info,
        **summary.as_dict(),
        "final_train_loss": curve[-1][1] if curve else None,
        "final_val_loss": float(val_loss) if val_loss is not None else None,
        "loss_curve": [v for _, v in curve],
        "env": env,
        "run_dir": str(run_dir),
        "config": config,
    }
    if logger is not None and cfg.logger.name == "wandb" and rank_zero_only.rank == 0:
        run = logger.experiment
        results["wandb"] = {"id": run.id, "dir": str(Path(run.dir).parent), "mode": wandb_mode(cfg.logger.mode)}
        run.summary.update({k: v for k, v in results.items() if isinstance(v, (int, float, str)) and v is not None})
    if trainer.is_global_zero:
        write_json(run_dir / "results.json", results)
    if logger is not None and cfg.logger.name == "wandb":
        import wandb

        wandb.finish(exit_code=0 if status in ("completed", "interrupted") else 1)
    if failure is not None:
        raise failure
    if graceful.requested:
        console.print(f"[bold]harness[/]: stopped at step {trainer.global_step} ({graceful.requested}); "
                      f"continue with: python -m harness.train resume={run_dir}")
    tps = f"{summary.tokens_per_s:,.0f}" if summary.tokens_per_s else "n/a"
    console.print(
        f"[bold]harness[/]: done: accel={label} on {device}: {tps} tokens/s (median of {summary.windows} "
        f"windows), warm-up {summary.warmup_s or 0:.1f}s, final loss {results['final_train_loss']}, "
        f"results -> {run_dir / 'results.json'}"
    )
    return results


def validate_with_data(cfg: DictConfig) -> None:
    """Config ranges plus the cheap data checks (a missing text file) that need no corpus build."""
    validate(cfg)
    if cfg.data.name == "text" and not Path(str(cfg.data.path)).expanduser().is_file():
        from harness.data import DataError

        raise DataError(f"data.path={cfg.data.path!r}: no such file (data=text needs an existing text file)")


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def hydra_main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    previous = None
    run_dir = Path(hc.runtime.output_dir)
    if cfg.resume:
        cfg, previous = load_resume(Path(cfg.resume))
        run_dir = Path(cfg.resume)
        print(f"harness: resuming {run_dir} from its last checkpoint ({previous.get('status')} run) with its "
              "saved config (other overrides are ignored)", file=sys.stderr)
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
        raise


def record_failure(run_dir: Path, cfg: DictConfig, exc: BaseException) -> None:
    """Mark the run's results.json failed (gate, NaN) or crashed, with the error, unless the run wrote
    its own final results; what a 'running' record already held (config, W&B id) is kept."""
    from harness.reliability import NonFiniteLossError
    from harness.results import read_json, write_json

    path = run_dir / "results.json"
    record = {"method": cfg.accel.name, "compile_model": bool(cfg.compile_model),
              "model": {"name": cfg.model.name}, "run_dir": str(run_dir)}
    try:
        if path.exists():
            existing = read_json(path)
            if existing.get("status") != "running":
                return
            record = existing
        record["status"] = "failed" if isinstance(exc, (GateError, NonFiniteLossError)) else "crashed"
        record["error"] = f"{type(exc).__name__}: {exc}"
        write_json(path, record)
    except OSError:
        pass  # the directory itself is the problem (OutputDirError): nothing to write into


def _distributed(cfg: DictConfig) -> bool:
    devices = str(cfg.trainer.devices)
    return int(cfg.trainer.num_nodes) > 1 or (devices.isdigit() and int(devices) > 1) or devices in ("-1", "auto")


def _run_job_in_subprocess(overrides: list[str], run_dir: Path, group: str) -> None:
    import subprocess

    cmd = [sys.executable, "-m", "harness.train", *overrides, f"logger.group={group}", f"hydra.run.dir={run_dir}"]
    subprocess.run(cmd, check=True, cwd=os.getcwd())


def main() -> None:
    precheck_overrides(sys.argv[1:], CONF_DIR, "config", validate=validate_with_data)
    hydra_main()


if __name__ == "__main__":
    main()
