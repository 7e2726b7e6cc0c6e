"""Speedup study: ``python -m harness.study [overrides]`` (or ``harness-study``) runs every chosen accel
configuration end to end on the same model, data, seed and batch order, behind correctness checks, and
writes one study directory:

* ``report.md``, ``results.csv`` (one row per method and sweep point) and ``runs.csv`` (one row per
  run): tokens/s (median over repeats, 95% interval), speedups vs the baseline (``study.baseline``,
  default ``naive``) and the reference (``study.reference``, default ``torch``) with their intervals
  ("within noise" when an interval contains 1.0), step time p50/p90 and the noisy flag, peak memory,
  MFU, warm-up seconds, final loss, parity and PASS/FAIL with the reason (harness.study.report);
* ``throughput.png``, ``loss.png`` and, for sweeps, ``scaling.png`` and ``memory.png`` (harness.study.charts);
* ``runs/[<point>/]<method>[/r<repeat>]/``: each run's ``results.json``, ``parity_probe.json`` (and W&B run,
  grouped by study).

Which configurations: ``study.methods`` (names of files in ``conf/accel/``), by default every one, so a
method added as one module + one config file is in the default study; those that cannot run here are
SKIPPED with the reason. Timing-only methods (the registry's ``exact=False``, e.g. the no-softmax
floor) are timed, never compared.
Each configuration of ``study.loss_split`` (default triton, cuda) also runs with
``accel.patch=[attention]``, each of ``study.linear_loss`` with ``accel.loss_form=linear``: rows
``triton: attention + loss``, ``triton: attention``, ``triton: attention + linear loss``, and the
report's table of what the loss kernel adds (harness.study.plan, harness.study.ratios).

Correctness, before any speedup is reported (docs/studies.md): every op a method patches is checked
against float64 on the run's shapes, forward and backward (the kernel gate; ``study.kernel_gate=false``
skips it, and methods registered as ``approximate`` skip it by design); then its held-out probe loss
must track the reference run's within a tolerance derived from the reference's own spread across two
data orders (harness.study.parity). The default data is the stdlib corpus (bytes, where the loss falls)
with a GPT's vocabulary kept at the study model's size (``study.vocab_size``; a Llama-family model keeps
its own), so the LM head costs what it costs in the real model.

Repeats (``study.repeats=N``) run round-robin: every method once, then every method again.
Sweeps (``study.sweep=context`` over ``study.contexts`` at a fixed number of tokens per step, or
``study.sweep=model`` over ``study.models``) repeat all of it at every point; a point that runs out
of memory is recorded as OOM, never a crash of the study. A method that crashes is recorded with its
error; the others go on. An existing study directory is never overwritten: a re-run writes into a
fresh ``rerun-<time>`` subdirectory. The report is rewritten after every run and its charts after
every point, so a study stopped early (a time limit, Ctrl+C) leaves the report of what it finished,
marked incomplete (harness.study.progress).

The package, one job a module: ``plan`` (what runs, in which order, at which points), ``checks`` (the
config checks before any work), ``run`` (running it), ``failures`` and ``profile`` (a run's failure, a
step's breakdown), ``rows`` (a row and its repeats), ``stats`` and ``parity`` (the statistics and the
parity rule), ``judge`` (parity and speedups), ``ratios``, ``compiled`` and ``labels`` (the loss
split's and the compiled rows' tables, and the rows' words), ``report``, ``charts`` and ``progress``
(the report files, as they stand while the study runs), ``collect`` and ``from_runs`` (the same report
from any directory of runs: ``python -m harness.report``). This module is the command line.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from harness.cli import run_app
from harness.config import CONF_DIR
from harness.study.checks import validate_study


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="study")
def hydra_main(cfg: DictConfig) -> None:
    # defined here, in harness.study: Hydra names the job (and its log file, study.log) after this module
    # (the study imported here, once the config is accepted: it loads Lightning, seconds a refusal need not wait)
    from harness.study.run import run_study

    run_study(cfg, Path(HydraConfig.get().runtime.output_dir))


def main() -> None:
    """``python -m harness.study`` and ``harness-study``: --help, the config checks, then the study."""
    run_app(hydra_main, "study", validate_study, app="study")
