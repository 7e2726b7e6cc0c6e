"""What a study reports: the report files of its rows (harness.study.rows), ``report.md``, ``results.csv``,
``runs.csv``, ``study.json`` and the charts of harness.study.charts; harness.study.judge decides parity
and the speedups first. Shared by ``harness.study`` (which runs the methods) and ``harness.report``
(which collects runs from any directory). How PASS/FAIL, intervals and noise are decided:
docs/studies.md.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any, Optional, Sequence

from omegaconf import DictConfig, OmegaConf

from harness.env import environment, switches_text
from harness.loggers import wandb_mode
from harness.results import atomic_write_text, write_json
from harness.study.charts import plot_study
from harness.study.compiled import compiled_lines, fallback_lines
from harness.study.drift import DRIFT_LIMIT, drift_sentence
from harness.study.labels import patched_words
from harness.study.ratios import ratio_lines
from harness.study.rows import StudyRow
from harness.study.stats import MIN_INTERVAL_RUNS
from harness.outcomes import NOISY_SPREAD

COLUMNS = [
    ("point", "point"), ("method", "method"), ("compiled", "compiled"), ("patch", "patch"), ("patched", "patched"),
    ("variant", "variant"), ("status", "status"), ("judged", "judged by"),
    ("repeats", "repeats"), ("tokens_per_s", "tokens/s"), ("tokens_per_s_lo", "tokens/s lo"),
    ("tokens_per_s_hi", "tokens/s hi"), ("speedup_vs_baseline", "vs baseline"),
    ("speedup_vs_baseline_lo", "vs baseline lo"), ("speedup_vs_baseline_hi", "vs baseline hi"),
    ("speedup_vs_reference", "vs reference"), ("speedup_vs_reference_lo", "vs reference lo"),
    ("speedup_vs_reference_hi", "vs reference hi"), ("noise", "noise"), ("step_ms_p50", "step ms p50"),
    ("step_ms_p90", "step ms p90"), ("step_spread", "p90/p50"), ("noisy", "noisy"), ("drift", "machine drift"),
    ("untrusted", "untrusted"), ("peak_mem_gib", "peak GiB"),
    ("vs_attention", "vs attention only"), ("vs_attention_lo", "vs attention only lo"),
    ("vs_attention_hi", "vs attention only hi"), ("mem_vs_attention", "peak memory vs attention only"),
    ("mem_vs_attention_lo", "peak memory vs attention only lo"),
    ("mem_vs_attention_hi", "peak memory vs attention only hi"),
    ("vs_compiled_baseline", "vs baseline + compile"), ("vs_compiled_baseline_lo", "vs baseline + compile lo"),
    ("vs_compiled_baseline_hi", "vs baseline + compile hi"),
    ("mem_vs_compiled_baseline", "peak memory vs baseline + compile"),
    ("mem_vs_compiled_baseline_lo", "peak memory vs baseline + compile lo"),
    ("mem_vs_compiled_baseline_hi", "peak memory vs baseline + compile hi"), ("mfu", "MFU"), ("warmup_s", "warm-up s"),
    ("final_loss", "final loss"),
    ("loss_diff_vs_reference", "loss - reference"), ("parity", "parity"), ("parity_dev", "parity dev"),
    ("parity_tol", "parity tol"), ("parity_step", "parity step"), ("data_seed", "data seed"), ("reason", "reason"),
]
#: CSV columns beyond COLUMNS: the sweep point's values
POINT_COLUMNS = ("context", "batch_size", "model")


def _value(r: StudyRow, key: str) -> Any:
    """A row's value for a column (``patched``: what its runs patched, in words)."""
    return patched_words(r.patched) if key == "patched" else getattr(r, key)


def _cell(v: Any, key: str) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        spec = {"tokens_per_s": ",.0f", "mfu": ".1%", "loss_diff_vs_reference": "+.4f", "final_loss": ".4f",
                "parity_dev": ".2%", "parity_tol": ".2%", "step_spread": ".2f", "speedup_vs_baseline": ".3f",
                "speedup_vs_reference": ".3f",
                "vs_attention": ".3f", "mem_vs_attention": ".3f", "vs_compiled_baseline": ".3f",
                "mem_vs_compiled_baseline": ".3f"}.get(key, ".2f")
        return format(v, spec)
    return str(v)


def _with_interval(r: StudyRow, key: str) -> str:
    v, lo, hi = getattr(r, key), getattr(r, key + "_lo"), getattr(r, key + "_hi")
    if v is None:
        return "-"
    text = _cell(v, key)
    if lo is not None and hi is not None:
        text += f" [{_cell(lo, key)}, {_cell(hi, key)}]"
    return text


def _noise_mark(r: StudyRow, name: str) -> str:
    """' within noise' when the row's speedup against ``name`` has an interval containing 1.0."""
    inside = r.noise[len("within noise ("):-1].split(", ") if r.noise else []
    return " within noise" if f"vs {name}" in inside else ""


def _untrusted(r: StudyRow, key: str) -> str:
    """' UNTRUSTED' on a speedup measured while the machine's speed drifted (harness.study.drift)."""
    return " UNTRUSTED" if r.untrusted and getattr(r, f"speedup_vs_{key}") is not None else ""


def _parity_cell(r: StudyRow) -> str:
    if r.parity in ("pass", "FAIL") and r.parity_dev is not None:
        return f"{r.parity} ({r.parity_dev:.2%} / {r.parity_tol:.2%} at step {r.parity_step})"
    return r.parity or "-"


def _spread_cell(r: StudyRow) -> str:
    if r.step_spread is None:
        return "-"
    return f"{r.step_spread:.2f}" + (" NOISY" if r.noisy else "")


TABLE = ["method", "status", "patched", "judged by", "repeats", "tokens/s [95% CI]", "vs {baseline} [95% CI]",
         "vs {reference} [95% CI]", "step ms p50 / p90", "p90/p50", "peak GiB", "MFU", "warm-up s", "final loss",
         "loss - {reference}", "parity (dev / tol at step)", "reason"]


def table_lines(rows: list[StudyRow], cfg: DictConfig) -> list[str]:
    """The report's table; one ratio column where the baseline is the reference (the same runs)."""
    names = {"baseline": cfg.study.baseline, "reference": cfg.study.reference}
    one = names["baseline"] == names["reference"]
    heads = [h for h in TABLE if not (one and h == "vs {reference} [95% CI]")]
    lines = ["| " + " | ".join(h.format(**names) for h in heads) + " |", "|" + "---|" * len(heads)]
    for r in rows:
        steps = "-" if r.step_ms_p50 is None else f"{r.step_ms_p50:.2f} / {_cell(r.step_ms_p90, 'step_ms_p90')}"
        vs_b = _with_interval(r, "speedup_vs_baseline") + _noise_mark(r, names["baseline"]) \
            + _untrusted(r, "baseline")
        vs_r = _with_interval(r, "speedup_vs_reference") + _noise_mark(r, names["reference"]) \
            + _untrusted(r, "reference")
        reason = r.reason.replace("|", "/").replace("\n", " ")
        lines.append("| " + " | ".join([
            r.label, r.status, patched_words(r.patched) or "-", r.judged or "-", str(r.repeats),
            _with_interval(r, "tokens_per_s"), vs_b, *([] if one else [vs_r]), steps,
            _spread_cell(r), _cell(r.peak_mem_gib, "peak_mem_gib"), _cell(r.mfu, "mfu"), _cell(r.warmup_s, "warmup_s"),
            _cell(r.final_loss, "final_loss"), _cell(r.loss_diff_vs_reference, "loss_diff_vs_reference"),
            _parity_cell(r), reason or "-"]) + " |")
    return lines


def parity_sentence(info: dict, cfg: DictConfig) -> str:
    if info.get("reference") is None:
        return f"Parity: no reference run (`{cfg.study.reference}`) here, so no parity and no speedups."
    what = ("held-out probe loss (the same fixed batches in every run)" if info["probe"] else
            "per-step training loss (no probe losses recorded: these carry batch noise)")
    if info["fixed"] is not None:
        rule = f"within a fixed {info['fixed']:.2%}"
    elif info["spread"] is None:
        rule = (f"within the floor, {info['floor']:.2%} (no spread run: the reference on a second data order "
                "did not run or did not finish)")
    else:
        rule = (f"within max({info['floor']:.2%}, {info['k']:g} x the spread of two reference runs on different "
                f"data orders up to that step); that spread reached {info['spread']:.2%} over the window "
                f"(`{info['spread_run']}`), so the tolerance ends at {info['tolerance_end']:.2%}")
    window = "the whole run" if info["steps"] >= 10**9 else f"the first {info['steps']} steps"
    return f"Parity: {what} over {window}, at every probe point {rule}."


def write_outputs(rows: list[StudyRow], cfg: DictConfig, out: Path, partial: bool,
                  settings: Optional[dict] = None, title: str = "Speedup study", notes: tuple = (),
                  round_robin: bool = True, env: Optional[dict] = None, charts: Optional[bool] = None,
                  progress: Optional[dict] = None, appendix: Sequence[str] = (), point_note: str = "") -> None:
    """The report files. ``env``: the environment the runs ran in (default: this machine's, as in a
    study); ``charts``: draw them (default: when not ``partial``); ``progress``: how far the study got
    (harness.study.progress), kept in study.json; ``appendix``: lines that end report.md;
    ``point_note``: a line under every point's heading (a link into the appendix)."""
    out.mkdir(parents=True, exist_ok=True)
    settings = settings or {}
    _write_csv(rows, out)
    env = env or environment()
    m, d, t = cfg.model, cfg.data, cfg.trainer
    repeats = max([r.repeats for r in rows] or [0])
    lines = [
        f"# {title}{' (incomplete)' if progress and not progress.get('complete') else ' (in progress)' * partial}",
        "",
        f"Model `{m.name}` ({m.n_layer} layers, {m.n_embd} dim, {m.n_head} heads, context {m.context}, vocabulary "
        f"{m.get('vocab_size') or 'of the data'}, batch {d.batch_size}), data `{d.name}`, {t.max_steps} steps "
        f"({t.warmup_steps} warm-up), seed {cfg.seed}; {env.get('device_name', '?')}, torch "
        f"{env.get('torch', '?')}, triton {env.get('triton', '?')}, git {env.get('git_revision', '?')}{switches_text(env)}.",
        (f"Repeats: {repeats} per method, interleaved round-robin. " if round_robin else
         f"Repeats: the runs of one method in a group (up to {repeats}). ")
        + f"Figures are medians over repeats; with {MIN_INTERVAL_RUNS} or more, [lo, hi] is a 95% t-interval on log "
        "values (speedups: paired by round where the runs came in rounds), and a speedup whose interval contains 1.0 "
        f"is marked \"within noise\". A run whose step times spread beyond p90/p50 = {NOISY_SPREAD:.2f} is NOISY. "
        "Speedups only for methods that passed the gate and parity; timing-only methods are timed, never compared "
        "(docs/studies.md).",
        *notes,
        *fallback_lines(rows),
    ]
    if d.name == "synthetic":
        lines.append("**Warning**: data `synthetic` (uniform random tokens): nothing can be learned, so parity "
                     "cannot tell a wrong method from a right one.")
    noisy = [f"{(r.point + ': ') if r.point else ''}{r.label} ({r.step_spread:.2f})" for r in rows if r.noisy]
    if noisy:
        lines.append(f"**Noisy runs** (step p90/p50 > {NOISY_SPREAD:.2f}): " + ", ".join(noisy) + ".")
    drifted = list(dict.fromkeys(r.point or "this study" for r in rows if r.untrusted))
    if drifted:
        lines.append(f"**The machine's speed drifted** beyond {DRIFT_LIMIT:.2f}x between runs (a calibration "
                     "timed before and after each run): comparisons UNTRUSTED at " + ", ".join(drifted) + ".")
    for point in dict.fromkeys(r.point for r in rows):
        prow = [r for r in rows if r.point == point]
        lines.append("")
        if point:
            lines += [f"## {point}", ""] + ([point_note, ""] if point_note else [])
        if point in settings:
            lines += [parity_sentence(settings[point], cfg), ""]
            drift = drift_sentence(settings[point].get("drift"))
            lines += [drift, ""] if drift else []
        lines += table_lines(prow, cfg)
    if cfg.study.get("sweep"):  # groups that are not the points of a sweep scale along nothing
        lines += sweep_lines(rows)
    lines += ratio_lines(rows)
    lines += compiled_lines(rows, cfg.study.baseline)
    lines += breakdown_lines(rows, cfg.study.baseline)
    lines += list(appendix)
    atomic_write_text(out / "report.md", "\n".join(lines) + "\n")
    write_json(out / "study.json", {"env": env, "config": OmegaConf.to_container(cfg, resolve=True),
                                    "parity": settings, "progress": progress, "rows": [r.__dict__ for r in rows]})
    if charts if charts is not None else not partial:
        plot_study(rows, out, cfg, settings, env.get("device_name", "?"))


def _write_csv(rows: list[StudyRow], out: Path) -> None:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow([k for k, _ in COLUMNS] + list(POINT_COLUMNS))
    for r in rows:
        w.writerow(["" if _value(r, k) is None else _value(r, k) for k, _ in COLUMNS]
                   + ["" if r.point_values.get(k) is None else r.point_values[k] for k in POINT_COLUMNS])
    atomic_write_text(out / "results.csv", buf.getvalue())
    buf = io.StringIO()
    w = csv.writer(buf)
    keys = ["round", "tokens_per_s", "step_ms_p50", "step_ms_p90", "step_ms_spread", "noisy", "peak_mem_gib",
            "warmup_s", "final_loss", "calibration_ms", "status", "run_dir"]
    w.writerow(["point", "method", "compiled", "patch", "patched", "data_seed"] + keys)
    for r in rows:
        for run in r.runs:
            w.writerow([r.point, r.method, r.compiled, r.patch, patched_words(r.patched),
                        "" if r.data_seed is None else r.data_seed]
                       + ["" if run.get(k) is None else run.get(k) for k in keys])
    atomic_write_text(out / "runs.csv", buf.getvalue())


def sweep_lines(rows: list[StudyRow]) -> list[str]:
    """A method x point table of tokens/s (OOM where it ran out of memory) for a sweep."""
    points = list(dict.fromkeys(r.point for r in rows))
    if len(points) < 2:
        return []
    labels = list(dict.fromkeys(r.label for r in rows if not r.role))
    lines = ["", "## Scaling: tokens/s (peak GiB)", "", "| method | " + " | ".join(points) + " |",
             "|" + "---|" * (len(points) + 1)]
    for label in labels:
        cells = []
        for p in points:
            r = next((x for x in rows if x.point == p and x.label == label), None)
            if r is None:
                cells.append("-")
            elif r.status == "OOM":
                cells.append("OOM")
            elif r.tokens_per_s:
                mem = f" ({r.peak_mem_gib:.1f})" if r.peak_mem_gib is not None else ""
                cells.append(f"{r.tokens_per_s:,.0f}{mem}" + ("" if r.status in ("PASS", "REFERENCE")
                                                             else f" {r.status}"))
            else:
                cells.append(r.status)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def breakdown_lines(rows: list[StudyRow], baseline: str = "") -> list[str]:
    prof = [r for r in rows if r.breakdown and "parts" in r.breakdown]
    if not prof:
        return []
    lines = ["", "## Where the time goes (one eager training step, harness.breakdown)", "",
             "Each part: ms per step (share); the bound in brackets is the most the whole step could speed up if "
             "that part took no time at all (Amdahl); the last column zeroes the attention and the loss together "
             "(the step's two softmaxes; in the linear loss form with the LM head).", "",
             "| method | step ms | attention | loss | matmuls | rest | attention + loss at zero |",
             "|---|---|---|---|---|---|---|"]
    for r in prof:
        b = r.breakdown
        cells = []
        for key in ("attention", "loss", "matmuls", "rest"):
            p = b["parts"].get(key)
            cells.append("-" if p is None else f"{p['name']}: {p['ms']:.2f} ({p['share']:.0%}) [{p['amdahl']:.2f}x]")
        both = b.get("amdahl_softmaxes")
        cells.append("-" if both is None else f"[{both:.2f}x]")
        where = f"{r.point}: " if r.point else ""
        lines.append(f"| {where}{r.label} | {b['step_ms']:.2f} | " + " | ".join(cells) + " |")
    lines += _bound_lines(rows, prof, baseline)
    errors = [f"{r.label}: {r.breakdown['error']}" for r in rows if r.breakdown and "error" in r.breakdown]
    if errors:
        lines += ["", "Not profiled: " + "; ".join(errors) + "."]
    return lines


def _bound_lines(rows: list[StudyRow], prof: list[StudyRow], baseline: str) -> list[str]:
    """Per point, the model's bound read from the baseline's eager step (its attention and loss at zero cost)
    beside what the eager rows reach against that baseline: how close each figure is to the limit."""
    lines = []
    for base in prof:
        if base.method != baseline or base.compiled or base.variant or base.role or base.setting:
            continue
        bound = base.breakdown.get("amdahl_softmaxes")
        if not bound:
            continue
        reach = [f"{r.label} {r.speedup_vs_baseline:.2f}x" for r in rows
                 if r.point == base.point and not r.compiled and not r.role and r is not base
                 and r.speedup_vs_baseline is not None]
        where = f" at {base.point}" if base.point else ""
        lines += ["", f"**The model's bound{where}**: with the baseline `{base.label}`'s step "
                      f"({base.breakdown['step_ms']:.2f} ms), its attention and loss at zero cost, a step could run at "
                      f"most {bound:.2f}x as fast"
                      + (f"; eager rows against it: {', '.join(reach)}." if reach else ".")]
    return lines


def log_to_wandb(rows: list[StudyRow], cfg: DictConfig, out: Path, group: str) -> None:
    """The study's table and charts as one W&B run of the study's group (with ``logger=wandb``)."""
    if cfg.logger.name != "wandb":
        return
    import wandb  # here: a heavy import that only logger=wandb needs

    run = wandb.init(project=cfg.logger.project, group=group, job_type="study", name=group, dir=str(out),
                     mode=wandb_mode(cfg.logger.mode), config=OmegaConf.to_container(cfg, resolve=True))
    table = wandb.Table(columns=[k for k, _ in COLUMNS])
    for r in rows:
        table.add_data(*[_cell(_value(r, k), k) for k, _ in COLUMNS])
    logged: dict = {"study/report": table}
    for path in sorted(out.glob("*.png")):
        logged[f"study/{path.stem}"] = wandb.Image(str(path))
    run.log(logged)
    run.finish()
