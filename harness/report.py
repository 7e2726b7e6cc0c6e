"""Build a study-style report from any directory of runs: ``python -m harness.report <dir> [--out DIR]``.

It collects every ``results.json`` under the directory (a Hydra multirun sweep, a study, runs copied
from a cluster), groups runs that are comparable (same model shape, batch, sequence length and data),
checks each run's loss curve against the eager reference run of its group (``--reference``, default ``torch``), and writes ``report.md``,
``results.csv`` and the charts, exactly as ``harness.study`` does. Crashed and failed jobs appear with
their error and no speedup. Nothing in the source directory is modified unless ``--out`` points there.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Optional

from omegaconf import OmegaConf

from harness.study_report import StudyRow, finish, write_outputs

STATUS = {"completed": "PASS", "failed": "FAIL", "crashed": "CRASH", "interrupted": "INTERRUPTED",
          "nonfinite": "FAIL"}


def collect(root: Path) -> list[dict]:
    found = []
    for path in sorted(Path(root).rglob("results.json")):
        try:
            res = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            found.append({"status": "crashed", "error": f"unreadable {path}: {exc}", "method": path.parent.name,
                          "run_dir": str(path.parent)})
            continue
        res.setdefault("run_dir", str(path.parent))
        found.append(res)
    return found


def group_key(res: dict) -> tuple:
    m = res.get("model") or {}
    d = res.get("data") or {}
    return (m.get("name"), m.get("n_layer"), m.get("n_embd"), m.get("n_head"), d.get("batch_size"),
            d.get("seq_len") or m.get("context"), d.get("name"))


def to_row(res: dict) -> StudyRow:
    status = STATUS.get(res.get("status", "crashed"), "CRASH")
    row = StudyRow(res.get("method", "?"), bool(res.get("compile_model")), status,
                   reason=(res.get("error") or "") if status != "PASS" else "", exact=res.get("exact", True) is not False)
    if not row.exact and status == "PASS":
        row.status, row.reason = "TIMING-ONLY", f"timing only ({res.get('kernels_method', row.method)})"
    row.patched = res.get("patched")
    if status in ("PASS", "INTERRUPTED") or row.status == "TIMING-ONLY":
        row.tokens_per_s = res.get("tokens_per_s")
        row.step_ms_p50, row.step_ms_p90 = res.get("step_ms_p50"), res.get("step_ms_p90")
        row.peak_mem_gib, row.mfu, row.warmup_s = res.get("peak_mem_gib"), res.get("mfu"), res.get("warmup_s")
        row.final_loss, row.loss_curve = res.get("final_train_loss"), res.get("loss_curve") or []
    if status == "INTERRUPTED":
        row.reason = f"interrupted at step {res.get('steps_done')}"
    return row


def build_report(root: Path, out: Optional[Path] = None, parity_steps: int = 20, parity_tol: float = 0.02,
                 reference: str = "torch", baseline: str = "naive") -> list[StudyRow]:
    runs = collect(root)
    if not runs:
        raise FileNotFoundError(f"no results.json under {root}")
    out = Path(out or root)
    groups: dict[tuple, list[dict]] = {}
    for res in runs:
        groups.setdefault(group_key(res), []).append(res)
    all_rows: list[StudyRow] = []
    for key, members in groups.items():
        rows = [to_row(r) for r in members]
        study_cfg = OmegaConf.create({"study": {"parity_steps": parity_steps, "parity_tol": parity_tol,
                                                "reference": reference, "baseline": baseline}})
        finish(rows, study_cfg)
        for r in rows:
            r.reason = (r.reason + f" [group: {key[0]} batch {key[4]} seq {key[5]}]").strip() if len(groups) > 1 else r.reason
        all_rows += rows
    first = runs[0]
    model = first.get("model") or {}
    cfg = OmegaConf.create({
        "model": {k: model.get(k, "?") for k in ("name", "n_layer", "n_embd", "n_head", "context")},
        "data": {k: (first.get("data") or {}).get(k, "?") for k in ("name", "batch_size")},
        "trainer": {"max_steps": (first.get("config") or {}).get("trainer", {}).get("max_steps", "?"),
                    "warmup_steps": (first.get("config") or {}).get("trainer", {}).get("warmup_steps", "?")},
        "seed": first.get("seed", "?"),
        "study": {"parity_steps": parity_steps, "parity_tol": parity_tol, "reference": reference, "baseline": baseline},
    })
    write_outputs(all_rows, cfg, out, partial=False)
    return all_rows


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m harness.report", description=__doc__.split("\n\n")[0])
    p.add_argument("root", type=Path, help="a directory holding runs (results.json files), e.g. a sweep dir")
    p.add_argument("--out", type=Path, default=None, help="where to write the report (default: root)")
    p.add_argument("--parity-steps", type=int, default=20)
    p.add_argument("--parity-tol", type=float, default=0.02)
    p.add_argument("--reference", default="torch", help="the run every loss curve is compared with (default: torch)")
    p.add_argument("--baseline", default="naive", help="the run speedups are given against (default: naive)")
    a = p.parse_args(argv)
    build_report(a.root, a.out, a.parity_steps, a.parity_tol, a.reference, a.baseline)
    print(((a.out or a.root) / "report.md").read_text())


if __name__ == "__main__":
    main()
