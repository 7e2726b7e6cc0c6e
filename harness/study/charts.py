"""A study's charts (matplotlib, written next to report.md):

* ``throughput.png``: tokens/s and the speedup over the baseline per method (named with the softmaxes
  it patched), the value on every bar, 95% whiskers with repeats, failed methods in red, timing-only
  in gray, speedups within noise hatched;
* ``loss.png``: left, the reference's loss (training and probe) to show that the loss falls; right,
  every method's probe-loss difference from the reference (identical curves would hide each other if
  drawn as losses) inside the parity tolerance band, the spread run dashed;
* sweeps only (``study.sweep``, or runs that differ only in T or the model): ``scaling.png``
  (tokens/s vs T or model per method) and ``memory.png`` (peak memory), an
  out-of-memory point drawn as a red x with "OOM"; per-point charts are ``throughput-<point>.png`` and
  ``loss-<point>.png``.

Titles name the model and the device, wrapped to the figure's width; figures use matplotlib's
constrained layout, which makes room for long tick labels and titles instead of cutting them off (and
does not warn as tight_layout does). Bars of NOISY runs say so; speedups measured while the machine's
speed drifted (harness.study.drift) are drawn gray, cross-hatched and labelled UNTRUSTED.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Optional

import torch

from harness.study.labels import patched_words
from harness.study.parity import envelope, rel_diffs, tolerance_at

COLORS = {"FAIL": "tab:red", "CRASH": "tab:red", "OOM": "tab:red", "TIMING-ONLY": "tab:gray", "UNCHECKED": "tab:olive"}


def _plt():
    """pyplot on the Agg backend (files only, no display needed)."""
    # here, not at the top: the backend must be chosen before pyplot is first imported, and only a
    # report that draws needs matplotlib at all
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after matplotlib.use: pyplot picks its backend on import

    return plt


def _wrap(text: str, inches: float, fontsize: float) -> str:
    """``text`` broken into lines that fit ``inches`` at ``fontsize`` (an average glyph: 0.55 em)."""
    return textwrap.fill(text, max(20, int(inches * 72 / (0.55 * fontsize))))


def _slug(point: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in point).strip("_")


def model_title(cfg, point_values: Optional[dict], device: str) -> str:
    m, d = cfg.model, cfg.data
    pv = point_values or {}
    name = pv.get("model") or m.name
    ctx = pv.get("context") or d.get("seq_len") or m.context
    batch = pv.get("batch_size") or d.batch_size
    dims = "" if pv.get("model") else f" ({m.n_layer}L, {m.n_embd}d, {m.n_head} heads)"
    return f"{name}{dims}, T={ctx}, batch {batch}, data {d.name} on {device}"


def plot_study(rows: list, out: Path, cfg, settings: dict, device: str) -> None:
    points = list(dict.fromkeys(r.point for r in rows))
    for i, point in enumerate(points, 1):
        prow = [r for r in rows if r.point == point]
        slug = _slug(point)
        suffix = "" if len(points) == 1 else f"-{slug}" if len(slug) <= 24 else f"-{i}"
        title = model_title(cfg, prow[0].point_values if prow else None, device)
        plot_throughput(prow, out / f"throughput{suffix}.png", cfg.study.baseline, title)
        plot_loss(prow, out / f"loss{suffix}.png", settings.get(point) or {}, title)
    if len(points) > 1 and cfg.study.get("sweep"):  # groups that are no sweep scale along nothing
        plot_scaling(rows, out, cfg, device)


def _errs(rows: list, key: str) -> Optional[list]:
    """Error-bar lengths below and above each median (0 where there is no interval). The interval is
    on log values around their mean, the bar at the median: identical repeats give an interval a
    rounding away from the median, and a skewed set can leave the median just outside it, so the
    lengths are clamped at 0 (matplotlib refuses negative ones)."""
    lo = [max(0.0, getattr(r, key) - getattr(r, key + "_lo")) if getattr(r, key + "_lo") is not None else 0.0
          for r in rows]
    hi = [max(0.0, getattr(r, key + "_hi") - getattr(r, key)) if getattr(r, key + "_hi") is not None else 0.0
          for r in rows]
    return [lo, hi] if any(lo) or any(hi) else None


def _named(r) -> str:
    """A bar's name: the row's label, with what its runs patched unless the label says it."""
    what = patched_words(r.patched, detail=False)
    return r.label if r.patch or not what else f"{r.label} [{what}]"


def plot_throughput(rows: list, path: Path, baseline: str, title: str) -> None:
    timed = [r for r in rows if r.tokens_per_s and not r.role]
    if not timed:
        return
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(14, 2.2 + 0.42 * len(timed)), layout="constrained")
    colors = [COLORS.get(r.status, "tab:blue") for r in timed]
    bars = a.barh([_named(r) for r in timed], [r.tokens_per_s for r in timed], color=colors,
                  xerr=_errs(timed, "tokens_per_s"), capsize=3)
    a.bar_label(bars, labels=[f"{r.tokens_per_s:,.0f}" + (" NOISY" if r.noisy else "") for r in timed], padding=4,
                fontsize=7)
    a.set_xlabel("tokens/s (median" + (", 95% interval)" if _errs(timed, "tokens_per_s") else ")"))
    a.set_title(_wrap("throughput (red: FAIL, gray: timing only, olive: no reference to check against; NOISY: "
                      "step times spread)", 6.5, 9), fontsize=9)
    a.invert_yaxis()
    a.margins(x=0.18)
    sp = [r for r in timed if r.speedup_vs_baseline]
    if sp:
        noise = [bool(r.noise) for r in sp]
        bars = b.barh([_named(r) for r in sp], [r.speedup_vs_baseline for r in sp],
                      color=["tab:gray" if n or r.untrusted else "tab:green" for r, n in zip(sp, noise)],
                      hatch=None, xerr=_errs(sp, "speedup_vs_baseline"), capsize=3)
        for bar, r, n in zip(bars, sp, noise):
            if r.untrusted or n:
                bar.set_hatch("xx" if r.untrusted else "//")
        b.bar_label(bars, labels=[f"{r.speedup_vs_baseline:.2f}x" + (" (noise)" if n else "")
                                  + (" UNTRUSTED" if r.untrusted else "") + (" NOISY" if r.noisy else "")
                                  for r, n in zip(sp, noise)], padding=4, fontsize=7)
        b.axvline(1.0, color="black", linewidth=0.8)
        b.invert_yaxis()
        b.margins(x=0.22)
    b.set_xlabel(f"speedup vs eager {baseline}")
    b.set_title(_wrap("speedup (passing methods; hatched: interval contains 1.0; cross-hatched UNTRUSTED: the "
                      "machine's speed drifted)", 6.5, 9), fontsize=9)
    fig.suptitle(_wrap(title, 13, 10), fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _legend(text: str) -> str:
    return " " + text if text.startswith("_") else text  # matplotlib drops labels that start with "_"


def _curve(r) -> list:
    return r.probe_curve or [[i, v] for i, v in enumerate(r.loss_curve)]


def plot_loss(rows: list, path: Path, info: dict, title: str) -> None:
    ref = next((r for r in rows if r.parity == "reference"), None)
    curves = [r for r in rows if r.exact and (r.probe_curve or r.loss_curve)]
    if not curves:
        return
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(14, 4.8), layout="constrained")
    base = ref or curves[0]
    a.plot(range(len(base.loss_curve)), base.loss_curve, color="tab:blue", linewidth=0.8, alpha=0.6,
           label=f"{base.label}: training loss (each step its own batch)")
    if base.probe_curve:
        s, v = zip(*base.probe_curve)
        a.plot(s, v, "o-", color="tab:blue", markersize=3, label=f"{base.label}: probe loss (fixed held-out batches)")
    spread = next((r for r in rows if r.role == "spread" and r.probe_curve), None)
    if spread:
        s, v = zip(*spread.probe_curve)
        a.plot(s, v, "s--", color="black", markersize=3, linewidth=0.8, label=f"{spread.label}: probe loss")
    a.set_xlabel("step")
    a.set_ylabel("loss")
    a.set_title("the reference's loss", fontsize=9)
    a.legend(fontsize=7)
    if ref is not None:
        steps = int(info.get("steps") or 10**9)
        k, floor, fixed = info.get("k", 3.0), info.get("floor", 0.005), info.get("fixed")
        env = envelope(_curve(spread), _curve(ref), steps) if spread and fixed is None else {}
        ref_pts = {int(s): v for s, v in _curve(ref)}
        xs = sorted(s for s in ref_pts if s <= steps)
        if xs:
            tol = [100 * tolerance_at(s, env, k, floor, fixed) for s in xs]
            b.fill_between(xs, [-t for t in tol], tol, step="post", color="tab:green", alpha=0.15,
                           label="parity tolerance")
        for r in curves:
            if r is ref:
                continue
            diffs = rel_diffs(_curve(r), _curve(ref), steps)
            pts = {int(s): v for s, v in _curve(r)}
            xs_r = [s for s in diffs if diffs[s] == diffs[s] and diffs[s] != float("inf")]
            ys = [100 * (pts[s] - ref_pts[s]) / abs(ref_pts[s]) for s in xs_r]
            style = {"linestyle": "--", "color": "black"} if r.role == "spread" else \
                {"color": "tab:red"} if r.parity == "FAIL" else {}
            b.plot(xs_r, ys, marker=".", linewidth=1, label=_legend(f"{r.label} ({r.status}, parity {r.parity})"),
                   **style)
        b.axhline(0.0, color="black", linewidth=0.6)
        b.set_ylabel(f"(loss - {ref.label}) / {ref.label}, %")
        b.set_title("difference from the reference " + ("(probe loss)" if ref.probe_curve else "(training loss)"),
                    fontsize=9)
        b.legend(fontsize=7)
    b.set_xlabel("step")
    fig.suptitle(_wrap(title, 13, 10), fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _gpu_gib() -> Optional[float]:
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(0).total_memory / 2**30


def plot_scaling(rows: list, out: Path, cfg, device: str) -> None:
    """tokens/s and peak memory against the swept quantity, per method; OOM points marked."""
    plt = _plt()
    sweep = cfg.study.get("sweep") or "point"
    points = list(dict.fromkeys(r.point for r in rows))
    if sweep == "context":
        xval = {p: next(r.point_values.get("context") for r in rows if r.point == p) for p in points}
        xlabel = "context T (tokens per step fixed: batch = tokens / T)"
    else:
        xval = {p: i for i, p in enumerate(points)}
        xlabel = "model"
    labels = list(dict.fromkeys(r.label for r in rows if not r.role))
    m = cfg.model
    if sweep == "context":
        title = f"{m.name} ({m.n_layer}L, {m.n_embd}d, {m.n_head} heads), data {cfg.data.name} on {device}"
    else:
        title = f"models {', '.join(points)}, data {cfg.data.name} on {device}"
    for key, fname, ylabel in (("tokens_per_s", "scaling.png", "tokens/s (median)"),
                               ("peak_mem_gib", "memory.png", "peak memory, GiB")):
        fig, ax = plt.subplots(figsize=(9, 5), layout="constrained")
        drawn = False
        ooms = []
        for i, label in enumerate(labels):
            color = f"C{i % 10}"
            mine = [r for r in rows if r.label == label]
            xs = [xval[r.point] for r in mine if getattr(r, key) is not None and r.status != "OOM"]
            ys = [getattr(r, key) for r in mine if getattr(r, key) is not None and r.status != "OOM"]
            if xs:
                errs = None
                if key == "tokens_per_s":
                    good = [r for r in mine if r.tokens_per_s is not None and r.status != "OOM"]
                    errs = _errs(good, "tokens_per_s")
                ax.errorbar(xs, ys, yerr=errs, marker="o", color=color, label=_legend(label), capsize=3, linewidth=1)
                for x, y in zip(xs, ys):
                    ax.annotate(f"{y:,.0f}" if key == "tokens_per_s" else f"{y:.1f}", (x, y), fontsize=6,
                                textcoords="offset points", xytext=(0, 5), ha="center")
                drawn = True
            ooms += [(xval[r.point], color, label) for r in mine if r.status == "OOM"]
        xs_all = sorted(set(xval.values()))
        if sweep == "context":
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs_all, [str(v) for v in xs_all])
            ax.set_xlim(xs_all[0] / 1.4, xs_all[-1] * 1.4)
        else:
            ax.set_xticks(list(xval.values()), [textwrap.fill(p, 16) for p in points])
            ax.set_xlim(-0.5, len(points) - 0.5)
            if len(points) * max(len(p) for p in points) > 60:  # they would run into each other level
                plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
        capacity = _gpu_gib() if key == "peak_mem_gib" else None
        if capacity:
            ax.axhline(capacity, color="tab:red", linewidth=0.8, linestyle=":",
                       label=f"GPU memory ({capacity:.0f} GiB)")
        if not drawn:
            ax.set_yticks([])
            ax.text(0.5, 0.5, "not measured here" + (" (the CPU records no peak memory)" if key == "peak_mem_gib"
                                                     else ""), ha="center", va="center", transform=ax.transAxes)
        if ooms and drawn:  # room above (memory) or below (throughput) the data for the OOM marks
            lo, hi = ax.get_ylim()
            ax.set_ylim(lo, hi + 0.15 * (hi - lo)) if key == "peak_mem_gib" else ax.set_ylim(lo - 0.15 * (hi - lo), hi)
        stacked: dict = {}
        for x, color, label in ooms:
            # in axes height: at the top (memory: past what fits) or the bottom (throughput: none)
            n = stacked[x] = stacked.get(x, -1) + 1
            y = 0.95 - 0.06 * n if key == "peak_mem_gib" else 0.04 + 0.06 * n
            ax.scatter([x], [y], marker="x", s=80, color=color, zorder=5, transform=ax.get_xaxis_transform())
            ax.annotate(f"OOM ({label})", (x, y), xycoords=ax.get_xaxis_transform(), fontsize=7, color=color,
                        textcoords="offset points", xytext=(5, -10 if key == "peak_mem_gib" else 4))
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        what = "throughput" if key == "tokens_per_s" else "peak memory"
        ax.set_title(_wrap(f"{what} by {sweep}: {title}", 8.5, 9), fontsize=9)
        fig.savefig(out / fname, dpi=110)
        plt.close(fig)
