"""Record the probe-loss curves that tests/test_study.py checks the parity rule on.

For each seed, one real study on the CPU (tests/study_methods.QUICK, the kernel gate off): the
reference (torch), the reference on another data order (the spread run), the independent correct
softmax and the unnormalized one (tests/study_methods). Writes tests/data/parity_curves.json:

    python scripts/record_parity_curves.py [--seeds 1-20] [--out tests/data/parity_curves.json]

About four runs of a few seconds each per seed; the test then judges all the seeds in milliseconds.
``--gpu`` runs the study's own configuration instead (gpt2s, bf16, 100 steps, the vocabulary at
50304; about a minute a seed on an H200) and prints each seed's spread and margins: the check of the
rule's constants on the hardware the studies run on (it writes to --out, never to the test's file
unless told to).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests import study_methods as sm  # noqa: E402


def dumps(record: dict) -> str:
    """JSON with one line per seed (the file stays small and diffs stay readable)."""
    head = {k: v for k, v in record.items() if k != "seeds"}
    lines = [json.dumps(head)[:-1] + ', "seeds": {']
    items = list(record["seeds"].items())
    for i, (seed, runs) in enumerate(items):
        comma = "," if i < len(items) - 1 else ""
        lines.append(f"  {json.dumps(seed)}: {json.dumps(runs, separators=(',', ':'))}{comma}")
    return "\n".join(lines + ["}}"]) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="1-20", help="a range a-b or a comma list")
    p.add_argument("--out", type=Path, default=None, help="default: tests/data/parity_curves.json "
                   "(with --gpu: parity_curves_gpu.json here)")
    p.add_argument("--gpu", action="store_true", help="the study's own configuration (gpt2s), not the CPU one")
    a = p.parse_args()
    a.out = a.out or (Path("parity_curves_gpu.json") if a.gpu else sm.FIXTURE)
    if "-" in a.seeds:
        lo, hi = a.seeds.split("-")
        seeds = list(range(int(lo), int(hi) + 1))
    else:
        seeds = [int(s) for s in a.seeds.split(",")]
    from harness.study.parity import envelope
    from harness.study.run import run_study

    sm.install(setattr)
    overrides = ["study.kernel_gate=false", f"study.methods=[torch,{sm.CORRECT},{sm.UNNORMALIZED}]"]
    if a.gpu:
        overrides += ["study.compiled=[]", "study.profile=false", "logger=none"]
    record = {"overrides": ([] if a.gpu else sm.QUICK) + overrides, "seeds": {}}
    t0 = time.time()
    for seed in seeds:
        cfg = sm.study_cfg(*overrides, f"seed={seed}", quick=not a.gpu)
        with tempfile.TemporaryDirectory() as tmp:
            rows = run_study(cfg, Path(tmp))
        record["seeds"][str(seed)] = {
            ("spread" if r.role else r.method): {"probe": r.probe_curve, "status": r.status}
            for r in rows
        }
        record["study"] = {k: cfg.study[k] for k in ("parity_k", "parity_floor", "parity_steps")}
        margins = ", ".join(f"{r.label} {r.status}" + (f" (dev {r.parity_dev:.4%} / tol {r.parity_tol:.2%} at step "
                                                         f"{r.parity_step})" if r.parity_dev is not None else "")
                            for r in rows)
        ref = next((r for r in rows if r.method == "torch" and not r.role), None)
        spread = next((r for r in rows if r.role), None)
        env = envelope(spread.probe_curve, ref.probe_curve, 10**9) if ref and spread else {}
        print(f"seed {seed}: spread {max(env.values()) if env else float('nan'):.3%}; {margins}", file=sys.stderr)
    record["seconds"] = round(time.time() - t0, 1)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(dumps(record))
    print(f"wrote {a.out} ({len(seeds)} seeds, {record['seconds']} s)", file=sys.stderr)


if __name__ == "__main__":
    main()
