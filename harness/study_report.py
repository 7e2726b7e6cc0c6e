"""What a study reports: one row per run (:class:`StudyRow`), parity against the reference run and
speedups against the baseline (:func:`finish`), and the report files (``report.md``, ``results.csv``,
``study.json``, ``throughput.png``, ``loss.png``). Shared by ``harness.study`` (which runs the methods) and
``harness.report`` (which collects runs from any directory)."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from harness.results import atomic_write_text, write_json


@dataclass
class StudyRow:
    method: str
    compiled: bool
    status: str  # PASS | FAIL | CRASH | SKIPPED | TIMING-ONLY | REFERENCE
    reason: str = ""
    exact: bool = True  # False: a timing-only method (the registry's flag): timed, never compared
    tokens_per_s: Optional[float] = None
    speedup_vs_baseline: Optional[float] = None
    speedup_vs_reference: Optional[float] = None
    step_ms_p50: Optional[float] = None
    step_ms_p90: Optional[float] = None
    peak_mem_gib: Optional[float] = None
    mfu: Optional[float] = None
    warmup_s: Optional[float] = None
    final_loss: Optional[float] = None
    loss_diff_vs_reference: Optional[float] = None
    parity: str = ""  # pass | FAIL | n/a
    breakdown: Optional[dict] = None  # study.profile: softmax fwd/bwd/other per step
    patched: Optional[dict] = None  # which softmaxes the method computed (harness.accel.Applied.as_dict)
    loss_curve: list = field(default_factory=list, repr=False)

    @property
    def label(self) -> str:
        return self.method + (" + compile" if self.compiled else "")


def parity(curve: list[float], ref: list[float], k: int, tol: float) -> tuple[bool, float, str]:
    n = min(k, len(curve), len(ref))
    if n == 0:
        return False, float("nan"), "no loss values to compare"
    worst = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(curve[:n], ref[:n]))
    finite = all(v == v and abs(v) != float("inf") for v in curve[:n])
    if not finite:
        return False, worst, "non-finite loss"
    if worst > tol:
        return False, worst, f"loss departs from the reference run by {worst:.1%} within {n} steps (tolerance {tol:.0%})"
    return True, worst, ""


def finish(rows: list[StudyRow], cfg: DictConfig) -> None:
    """Parity against the eager reference run (``study.reference``), then speedups against it and
    against the baseline (``study.baseline``) for the methods that passed everything."""
    ref_name, base_name = cfg.study.reference, cfg.study.baseline
    ref = next((r for r in rows if r.method == ref_name and not r.compiled and r.loss_curve), None)
    for r in rows:
        if r.status in ("SKIPPED", "CRASH", "FAIL") or not r.exact:
            r.parity = "n/a"
            continue
        if ref is None:
            r.parity = "n/a"
            continue
        if r is ref:
            r.parity, r.status = "reference", "REFERENCE"
            r.loss_diff_vs_reference = 0.0
            continue
        ok, worst, why = parity(r.loss_curve, ref.loss_curve, cfg.study.parity_steps, cfg.study.parity_tol)
        r.parity = "pass" if ok else "FAIL"
        if r.final_loss is not None and ref.final_loss is not None:
            r.loss_diff_vs_reference = r.final_loss - ref.final_loss
        if not ok:
            r.status, r.reason = "FAIL", why
    base = next((r for r in rows if r.method == base_name and not r.compiled and r.status in ("PASS", "REFERENCE")),
                None)
    for r in rows:
        if r.status not in ("PASS", "REFERENCE") or not r.tokens_per_s:
            continue  # no speedup for a failed, crashed or timing-only method
        if base and base.tokens_per_s:
            r.speedup_vs_baseline = r.tokens_per_s / base.tokens_per_s
        if ref and ref.tokens_per_s:
            r.speedup_vs_reference = r.tokens_per_s / ref.tokens_per_s


COLUMNS = [
    ("method", "method"), ("compiled", "compiled"), ("status", "status"), ("tokens_per_s", "tokens/s"),
    ("speedup_vs_baseline", "vs baseline"), ("speedup_vs_reference", "vs reference"), ("step_ms_p50", "step ms p50"),
    ("step_ms_p90", "step ms p90"), ("peak_mem_gib", "peak GiB"), ("mfu", "MFU"), ("warmup_s", "warm-up s"),
    ("final_loss", "final loss"), ("loss_diff_vs_reference", "loss - reference"), ("parity", "parity"),
    ("reason", "reason"),
]


def headers(cfg: DictConfig) -> list[str]:
    """Column headers, naming the study's baseline and reference."""
    names = {"speedup_vs_baseline": f"vs {cfg.study.baseline}", "speedup_vs_reference": f"vs {cfg.study.reference}",
             "loss_diff_vs_reference": f"loss - {cfg.study.reference}"}
    return [names.get(k, h) for k, h in COLUMNS]


def _cell(v: Any, key: str) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        spec = {"tokens_per_s": ",.0f", "mfu": ".1%", "loss_diff_vs_reference": "+.4f", "final_loss": ".4f"}.get(key, ".2f")
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
        f"context {cfg.model.context}, batch {cfg.data.batch_size}), data `{cfg.data.name}`, "
        f"{cfg.trainer.max_steps} steps ({cfg.trainer.warmup_steps} warm-up), seed {cfg.seed}; "
        f"{env['device_name']}, torch {env['torch']}, triton {env['triton']}, git {env['git_revision']}.",
        f"Parity: loss over the first {cfg.study.parity_steps} steps within {cfg.study.parity_tol:.0%} of the eager "
        f"`{cfg.study.reference}` run. Speedups (against `{cfg.study.baseline}` and `{cfg.study.reference}`) only "
        "for methods that passed the gate and parity; timing-only methods are timed, never compared.",
        "",
        "| " + " | ".join(headers(cfg)) + " |",
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
        plot_study(rows, out, cfg.study.baseline)


def plot_study(rows: list[StudyRow], out: Path, baseline: str = "baseline") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = [r for r in rows if r.tokens_per_s]
    if timed:
        fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.5))
        colors = ["tab:red" if r.status in ("FAIL", "CRASH") else "tab:gray" if not r.exact else "tab:blue"
                  for r in timed]
        a.barh([r.label for r in timed], [r.tokens_per_s for r in timed], color=colors)
        a.set_xlabel("tokens/s (median)")
        a.set_title("throughput (red: FAIL, gray: timing only)")
        sp = [r for r in timed if r.speedup_vs_baseline]
        b.barh([r.label for r in sp], [r.speedup_vs_baseline for r in sp], color="tab:green")
        b.axvline(1.0, color="black", linewidth=0.8)
        b.set_xlabel(f"speedup vs eager {baseline}")
        b.set_title("speedup (passing methods only)")
        fig.tight_layout()
        fig.savefig(out / "throughput.png", dpi=110)
        plt.close(fig)
    curves = [r for r in rows if r.loss_curve and r.exact]
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

    from harness.loggers import wandb_mode

    run = wandb.init(project=cfg.logger.project, group=group, job_type="study", name=group, dir=str(out),
                     mode=wandb_mode(cfg.logger.mode), config=OmegaConf.to_container(cfg, resolve=True))
    table = wandb.Table(columns=headers(cfg))
    for r in rows:
        table.add_data(*[_cell(getattr(r, k), k) for k, _ in COLUMNS])
    logged: dict = {"study/report": table}
    for name in ("throughput.png", "loss.png"):
        if (out / name).exists():
            logged[f"study/{name[:-4]}"] = wandb.Image(str(out / name))
    run.log(logged)
    run.finish()
