"""Speedup study: ``python -m harness.study [overrides]`` runs every chosen method end to end on the same
model, data, seed and batch order, behind a correctness gate, and writes one study directory:

* ``report.md`` and ``results.csv``: method, compiled or not, tokens/s (median), speedup vs ``naive``
  and vs ``torch`` (eager runs), step time p50/p90, peak memory, MFU, warm-up/compile seconds, final
  loss and its difference from the ``torch`` run, gate and parity PASS/FAIL with the reason;
* ``throughput.png`` (tokens/s and speedup by method) and ``loss.png`` (loss curves overlaid);
* ``runs/<method>/``: each run's own ``results.json`` (and W&B run, grouped by study).

Gate: before a method is timed its softmax is checked against float64 on the study's shapes (forward
and backward); during the study its loss over the first K steps must track the ``torch`` run's within
a bf16 tolerance. A method failing either is FAIL everywhere, with the reason, and gets no speedup. A
method that crashes is recorded with its error; the others go on. An existing study directory is never
overwritten: a re-run writes into a fresh ``rerun-<time>`` subdirectory.
"""

from __future__ import annotations

import copy
import gc
import io
import csv
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

from harness.cli import precheck_overrides
from harness.config import validate
from harness.results import atomic_write_text, write_json

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")


@dataclass
class StudyRow:
    method: str
    compiled: bool
    status: str  # PASS | FAIL | CRASH | SKIPPED | TIMING-ONLY | REFERENCE
    reason: str = ""
    tokens_per_s: Optional[float] = None
    speedup_vs_naive: Optional[float] = None
    speedup_vs_torch: Optional[float] = None
    step_ms_p50: Optional[float] = None
    step_ms_p90: Optional[float] = None
    peak_mem_gib: Optional[float] = None
    mfu: Optional[float] = None
    warmup_s: Optional[float] = None
    final_loss: Optional[float] = None
    loss_diff_vs_torch: Optional[float] = None
    parity: str = ""  # pass | FAIL | n/a
    breakdown: Optional[dict] = None  # study.profile: softmax fwd/bwd/other per step
    loss_curve: list = field(default_factory=list, repr=False)

    @property
    def label(self) -> str:
        return self.method + (" + compile" if self.compiled else "")


def accel_config(name: str) -> DictConfig:
    path = Path(CONF_DIR) / "accel" / f"{name}.yaml"
    if not path.exists():
        options = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise ValueError(f"study.methods: unknown method {name!r}; options: {', '.join(options)}")
    return OmegaConf.load(path)


def study_plan(cfg: DictConfig) -> list[tuple[str, bool]]:
    plan = [(m, False) for m in cfg.study.methods]
    if "torch" not in cfg.study.methods:
        plan.insert(0, ("torch", False))  # the parity reference always runs
    if cfg.study.floor:
        plan.append(("floor", False))
    return plan + [(m, True) for m in cfg.study.compiled]  # the slow compiles last


def unique_study_dir(path: Path) -> Path:
    """Never overwrite an earlier study: a directory that already holds one gets a fresh subdirectory."""
    if (path / "report.md").exists() or (path / "results.csv").exists() or (path / "runs").exists():
        fresh = path / f"rerun-{time.strftime('%Y%m%d-%H%M%S')}"
        print(f"study: {path} already holds a study; writing this one into {fresh}", file=sys.stderr)
        return fresh
    return path


def parity(curve: list[float], ref: list[float], k: int, tol: float) -> tuple[bool, float, str]:
    n = min(k, len(curve), len(ref))
    if n == 0:
        return False, float("nan"), "no loss values to compare"
    worst = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(curve[:n], ref[:n]))
    finite = all(v == v and abs(v) != float("inf") for v in curve[:n])
    if not finite:
        return False, worst, "non-finite loss"
    if worst > tol:
        return False, worst, f"loss departs from the torch run by {worst:.1%} within {n} steps (tolerance {tol:.0%})"
    return True, worst, ""


def run_one(cfg: DictConfig, method: str, compiled: bool, run_dir: Path, group: str) -> dict:
    from harness.train import run_training

    c = copy.deepcopy(cfg)
    a = accel_config(method)
    with open_dict(c):
        c.accel.name, c.accel.attention, c.accel.softmax = a.name, a.get("attention", "materialized"), a.get("softmax")
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
    avail = kernels.available_methods(include_timing_only=True)
    from rich.console import Console

    console = Console(stderr=True)
    for i, (method, compiled) in enumerate(plan, 1):
        row = StudyRow(method, compiled, "PASS")
        console.rule(f"[bold]study {i}/{len(plan)}: {row.label}")
        softmax = accel_config(method).get("softmax")
        if softmax and softmax in avail and not avail[softmax].available:
            row.status, row.reason = "SKIPPED", avail[softmax].reason
            rows.append(row)
            continue
        run_dir = out / "runs" / row.label.replace(" + ", "+")
        try:
            res = run_one(cfg, method, compiled, run_dir, group)
        except Exception as exc:  # a crash or a failed gate: recorded, the study goes on
            from harness.reliability import NonFiniteLossError
            from harness.train import GateError

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
        if method == "floor":
            row.status, row.reason = "TIMING-ONLY", "not a softmax: scores only scaled (the floor)"
        if cfg.study.profile and not compiled and softmax:
            try:
                row.breakdown = profile_method(cfg, softmax).as_dict()
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


def profile_method(cfg: DictConfig, softmax: str):
    """Where one training step's time goes with this softmax (see harness.breakdown)."""
    import torch

    import kernels
    from harness.breakdown import measure
    from harness.data import BatchStream, make_corpus
    from harness.methods import apply_accel
    from harness.train import build_model

    device = "cuda" if torch.cuda.is_available() else "cpu"
    seq = int(cfg.data.seq_len or cfg.model.context)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg).to(device)
    apply_accel(model, "materialized", softmax)
    corpus = make_corpus(cfg.data, seq)
    stream = BatchStream(None if corpus is None else corpus.train, model.config.vocab_size,
                         int(cfg.model.batch_size), seq, cfg.seed, "train", 0, 3)
    try:
        return measure(model, list(stream), kernels.bind(softmax))
    finally:
        del model
        _free_memory()


def _free_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def finish(rows: list[StudyRow], cfg: DictConfig) -> None:
    """Parity against the eager torch run, then speedups for the methods that passed everything."""
    ref = next((r for r in rows if r.method == "torch" and not r.compiled and r.loss_curve), None)
    for r in rows:
        if r.status in ("SKIPPED", "CRASH", "FAIL") or r.method == "floor":
            r.parity = "n/a"
            continue
        if ref is None:
            r.parity = "n/a"
            continue
        if r is ref:
            r.parity, r.status = "reference", "REFERENCE"
            r.loss_diff_vs_torch = 0.0
            continue
        ok, worst, why = parity(r.loss_curve, ref.loss_curve, cfg.study.parity_steps, cfg.study.parity_tol)
        r.parity = "pass" if ok else "FAIL"
        if r.final_loss is not None and ref.final_loss is not None:
            r.loss_diff_vs_torch = r.final_loss - ref.final_loss
        if not ok:
            r.status, r.reason = "FAIL", why
    naive = next((r for r in rows if r.method == "naive" and not r.compiled and r.status == "PASS"), None)
    for r in rows:
        if r.status not in ("PASS", "REFERENCE") or not r.tokens_per_s:
            continue  # no speedup for a failed, crashed or timing-only method
        if naive and naive.tokens_per_s:
            r.speedup_vs_naive = r.tokens_per_s / naive.tokens_per_s
        if ref and ref.tokens_per_s:
            r.speedup_vs_torch = r.tokens_per_s / ref.tokens_per_s


COLUMNS = [
    ("method", "method"), ("compiled", "compiled"), ("status", "status"), ("tokens_per_s", "tokens/s"),
    ("speedup_vs_naive", "vs naive"), ("speedup_vs_torch", "vs torch"), ("step_ms_p50", "step ms p50"),
    ("step_ms_p90", "step ms p90"), ("peak_mem_gib", "peak GiB"), ("mfu", "MFU"), ("warmup_s", "warm-up s"),
    ("final_loss", "final loss"), ("loss_diff_vs_torch", "loss - torch"), ("parity", "parity"), ("reason", "reason"),
]


def _cell(v: Any, key: str) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        spec = {"tokens_per_s": ",.0f", "mfu": ".1%", "loss_diff_vs_torch": "+.4f", "final_loss": ".4f"}.get(key, ".2f")
        return format(v, spec)
    return str(v)


def write_outputs(rows: list[StudyRow], cfg: DictConfig, out: Path, partial: bool) -> None:
    from harness.env import environment

    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow([k for k, _ in COLUMNS])
    for r in rows:
        w.writerow(["" if getattr(r, k) is None else getattr(r, k) for k, _ in COLUMNS])
    atomic_write_text(out / "results.csv", buf.getvalue())
    env = environment()
    lines = [
        f"# Speedup study{' (in progress)' if partial else ''}",
        "",
        f"Model `{cfg.model.name}` ({cfg.model.n_layer} layers, {cfg.model.n_embd} dim, {cfg.model.n_head} heads, "
        f"context {cfg.model.context}, batch {cfg.model.batch_size}), data `{cfg.data.name}`, "
        f"{cfg.trainer.max_steps} steps ({cfg.trainer.warmup_steps} warm-up), seed {cfg.seed}; "
        f"{env['device_name']}, torch {env['torch']}, triton {env['triton']}, git {env['git_revision']}.",
        f"Parity: loss over the first {cfg.study.parity_steps} steps within {cfg.study.parity_tol:.0%} of the eager "
        "`torch` run. Speedups only for methods that passed the gate and parity.",
        "",
        "| " + " | ".join(h for _, h in COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for r in rows:
        lines.append("| " + " | ".join(_cell(getattr(r, k), k) for k, _ in COLUMNS) + " |")
    prof = [r for r in rows if r.breakdown and "error" not in r.breakdown]
    if prof:
        lines += ["", "## Where the time goes (one eager training step)", "",
                  "| method | step ms | softmax fwd ms | softmax bwd ms | everything else ms | softmax share "
                  "| max speedup if the softmax were free |", "|---|---|---|---|---|---|---|"]
        for r in prof:
            b = r.breakdown
            lines.append(f"| {r.label} | {b['step_ms']:.2f} | {b['softmax_fwd_ms']:.2f} | {b['softmax_bwd_ms']:.2f} "
                         f"| {b['other_ms']:.2f} | {b['softmax_share']:.1%} | {b['amdahl_max_speedup']:.2f}x |")
    atomic_write_text(out / "report.md", "\n".join(lines) + "\n")
    write_json(out / "study.json", {"env": env, "config": OmegaConf.to_container(cfg, resolve=True),
                                    "rows": [r.__dict__ for r in rows]})
    if not partial:
        plot_study(rows, out)


def plot_study(rows: list[StudyRow], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = [r for r in rows if r.tokens_per_s]
    if timed:
        fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.5))
        colors = ["tab:red" if r.status in ("FAIL", "CRASH") else "tab:gray" if r.status == "TIMING-ONLY" else "tab:blue"
                  for r in timed]
        a.barh([r.label for r in timed], [r.tokens_per_s for r in timed], color=colors)
        a.set_xlabel("tokens/s (median)")
        a.set_title("throughput (red: FAIL, gray: timing only)")
        sp = [r for r in timed if r.speedup_vs_naive]
        b.barh([r.label for r in sp], [r.speedup_vs_naive for r in sp], color="tab:green")
        b.axvline(1.0, color="black", linewidth=0.8)
        b.set_xlabel("speedup vs eager naive")
        b.set_title("speedup (passing methods only)")
        fig.tight_layout()
        fig.savefig(out / "throughput.png", dpi=110)
        plt.close(fig)
    curves = [r for r in rows if r.loss_curve and r.method != "floor"]
    if curves:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for r in curves:
            ax.plot(range(len(r.loss_curve)), r.loss_curve, label=f"{r.label} ({r.status})", linewidth=1)
        ax.set_xlabel("step")
        ax.set_ylabel("train loss")
        ax.set_title("loss curves (same seed, same batches)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "loss.png", dpi=110)
        plt.close(fig)


def log_to_wandb(rows: list[StudyRow], cfg: DictConfig, out: Path, group: str) -> None:
    if cfg.logger.name != "wandb":
        return
    import wandb

    from harness.train import wandb_mode

    run = wandb.init(project=cfg.logger.project, group=group, job_type="study", name=group, dir=str(out),
                     mode=wandb_mode(cfg.logger.mode), config=OmegaConf.to_container(cfg, resolve=True))
    table = wandb.Table(columns=[h for _, h in COLUMNS])
    for r in rows:
        table.add_data(*[_cell(getattr(r, k), k) for k, _ in COLUMNS])
    logged: dict = {"study/report": table}
    for name in ("throughput.png", "loss.png"):
        if (out / name).exists():
            logged[f"study/{name[:-4]}"] = wandb.Image(str(out / name))
    run.log(logged)
    run.finish()


@hydra.main(version_base="1.3", config_path="../conf", config_name="study")
def hydra_main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    run_study(cfg, Path(HydraConfig.get().runtime.output_dir))


def main() -> None:
    precheck_overrides(sys.argv[1:], CONF_DIR, "study", validate=validate)
    hydra_main()


if __name__ == "__main__":
    main()
