"""Build a study-style report from any directory of runs: ``python -m harness.report <dir> [--out DIR]``.

A thin command line: the report itself (what it collects, compares and writes) is
harness.study.from_runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

from harness.study.from_runs import build_report, default_out


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m harness.report", description=__doc__.split("\n\n")[0].replace("``", ""))  # (RST markup)
    p.add_argument("root", type=Path, help="a directory holding runs (results.json files), e.g. a sweep dir")
    p.add_argument("--out", type=Path, default=None,
                   help="where to write the report (default: a new <root>-report-<time> beside root)")
    p.add_argument("--parity-steps", type=int, default=None, help="the parity window (default: the whole run)")
    p.add_argument("--parity-tol", type=float, default=None,
                   help="a fixed relative tolerance (default: derived from a spread run, else the floor)")
    p.add_argument("--parity-k", type=float, default=None, help="tolerance = max(floor, k x spread) (default 3)")
    p.add_argument("--parity-floor", type=float, default=None, help="the smallest tolerance (default 0.005)")
    p.add_argument("--reference", default=None,
                   help="the run every loss curve is compared with (default: the study's study.reference, else torch)")
    p.add_argument("--baseline", default=None,
                   help="the run speedups are given against (default: the study's study.baseline, else naive)")
    a = p.parse_args(argv)
    if not a.root.is_dir():
        p.error(f"{a.root} is not a directory")
    out = a.out if a.out is not None else default_out(a.root)
    try:
        build_report(a.root, out, a.parity_steps, a.parity_tol, a.reference, a.baseline, a.parity_k, a.parity_floor)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    print((out / "report.md").read_text())
    print(f"report: wrote report.md, results.csv, runs.csv, study.json and charts to {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
