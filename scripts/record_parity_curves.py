"""Record the probe-loss curves that tests/test_study.py checks the parity rule on.

For each seed, one real study on the CPU (tests/study_methods.QUICK, the kernel gate off): the
reference (torch), the reference on another data order (the spread run), the independent correct
softmax and the unnormalized one (tests/study_methods). Writes tests/data/parity_curves.json:

    python scripts/record_parity_curves.py [--seeds 1-20] [--out tests/data/parity_curves.json]

About four runs of a few seconds each per seed; the test then judges all the seeds in milliseconds.
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
    p.add_argument("--out", type=Path, default=sm.FIXTURE)
    a = p.parse_args()
    if "-" in a.seeds:
        lo, hi = a.seeds.split("-")
        seeds = list(range(int(lo), int(hi) + 1))
    else:
        seeds = [int(s) for s in a.seeds.split(",")]
    from harness.study import run_study

    sm.install(setattr)
    overrides = ["study.kernel_gate=false", f"study.methods=[torch,{sm.CORRECT},{sm.UNNORMALIZED}]"]
    record = {"overrides": sm.QUICK + overrides, "seeds": {}}
    t0 = time.time()
    for seed in seeds:
        cfg = sm.study_cfg(*overrides, f"seed={seed}")
        with tempfile.TemporaryDirectory() as tmp:
            rows = run_study(cfg, Path(tmp))
        record["seeds"][str(seed)] = {
            ("spread" if r.role else r.method): {"probe": r.probe_curve, "status": r.status}
            for r in rows
        }
        record["study"] = {k: cfg.study[k] for k in ("parity_k", "parity_floor", "parity_steps")}
        print(f"seed {seed}: " + ", ".join(f"{r.label} {r.status}" for r in rows), file=sys.stderr)
    record["seconds"] = round(time.time() - t0, 1)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(dumps(record))
    print(f"wrote {a.out} ({len(seeds)} seeds, {record['seconds']} s)", file=sys.stderr)


if __name__ == "__main__":
    main()
