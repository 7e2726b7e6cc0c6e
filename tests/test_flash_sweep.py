"""The flash plan sweep (``python -m harness.bench flash-sweep``, harness/bench/tuning/flash_sweep.py) in
Triton's interpreter at tiny shapes: candidates checked against float64 before they are timed, the phases
it skips, its shapes (grouped heads as H:Hkv). The helpers are tests/test_flash_attention.py's.
"""

from __future__ import annotations

import json

import pytest
import torch

import kernels
from harness.bench import main
from harness.bench.tuning import flash_sweep
from harness.bench.tuning.flash_sweep import parse_shapes
from tests.test_flash_attention import DEVICE


@pytest.mark.slow  # a sweep in the interpreter (~35 s)
def test_sweep_checks_and_times_both_dq_modes(tmp_path):
    """The plan sweep in the interpreter at a tiny shape: every candidate checked against float64
    first, the atomic-dq phase timed, an invalid combination skipped, a table entry printed."""
    out = tmp_path / "new" / "sweep.json"  # (its folder made)
    main(["flash-sweep", "--shapes", "1,2,40,16", "--device", DEVICE, "--no-baselines", "--rep-ms", "1", "--out", str(out),
          "--fwd-phases", "block_m=16 block_n=16",
          "--bwd-phases", "block_m1=16 block_n1=16 block_m2=16 block_n2=16 pre_block=16 | fused=1 | "
                          "fused=0 dq_mode=atomic | fused=1 dq_mode=atomic | fused=0 dq_mode=pass delta_in_dq=1"])
    recs = json.loads(out.read_text())
    bwd = [r for r in recs["results"] if r["direction"] == "fwd+bwd"]
    assert {r["plan"]["dq_mode"] for r in bwd} == {"pass", "atomic"}
    assert [r["plan"]["fused"] for r in bwd if r["plan"]["delta_in_dq"]] == [False]  # checked and timed
    assert all(r["status"] == "ok" and r["error"] <= kernels.ATTN_BWD_TOL[torch.bfloat16] for r in bwd)
    assert not any(r["plan"]["fused"] and r["plan"]["dq_mode"] == "atomic" for r in bwd)  # invalid: skipped
    assert set(recs["best"]) == {"1,2,40,40,16/causal/bfloat16"}


@pytest.mark.slow  # a sweep in the interpreter (~35 s)
def test_sweep_tries_the_program_order_only_where_causal(tmp_path):
    """FwdPlan.group changes only the causal launch: the sweep times its values there and leaves the
    phase out of the non-causal shape (the same launch four times otherwise)."""
    out = tmp_path / "flash_sweep.json"  # (--out a folder: the file goes inside, as the other sweeps write)
    main(["flash-sweep", "--shapes", "2,3,40,16", "--device", DEVICE, "--no-baselines", "--rep-ms", "1", "--out",
          str(tmp_path), "--causal", "both", "--mode", "fwd", "--fwd-phases", "block_m=16 block_n=16 | group=1,2,4"])
    recs = json.loads(out.read_text())["results"]
    groups = {causal: {r["plan"]["group"] for r in recs if r["shape"].split("/")[1] == causal} for causal in
              ("causal", "full")}
    assert groups == {"causal": {1, 2, 4}, "full": {1}}
    assert all(r["status"] == "ok" for r in recs)


def test_sweep_shapes_take_grouped_heads_and_refuse_what_is_not_a_shape():
    assert parse_shapes("4,12,4096,64;8,14:2,2048,64;1,4:4,16,32,16") == [
        (4, 12, 12, 4096, 4096, 64), (8, 14, 2, 2048, 2048, 64), (1, 4, 4, 16, 32, 16)]
    for bad in ("8,14:3,2048,64", "8,14:0,2048,64", "8,a,2048,64", "8,14,2048", "8,14:2:1,2048,64"):
        with pytest.raises(SystemExit, match="H:Hkv"):
            parse_shapes(bad)


@pytest.mark.slow  # a forward + backward candidate in Triton's interpreter: ~12 s
def test_sweep_checks_every_query_head_of_a_kv_heads_group(tmp_path, monkeypatch):
    """A grouped shape starts from the plans the launchers fall back to there (the Triton kernels') and each
    candidate is checked against float64 on every query head of kv head 0's group (in bwd mode its dk and dv,
    which sum over them)."""
    import json

    checked = []
    real = flash_sweep.reference_attention

    def recording(q, k, v, **kw):
        checked.append((q.shape[1], k.shape[1]))
        return real(q, k, v, **kw)

    monkeypatch.setattr(flash_sweep, "reference_attention", recording)
    main(["flash-sweep", "--shapes", "1,6:2,24,16", "--device", DEVICE, "--no-baselines", "--rep-ms", "1", "--out",
          str(tmp_path), "--mode", "bwd", "--bwd-phases", "block_m1=16 block_n1=16 block_m2=16 block_n2=16"])
    assert checked == [(3, 1)]  # kv head 0's whole group of 3 query heads (not only heads 0-1)
    recs = json.loads((tmp_path / "flash_sweep.json").read_text())["results"]
    assert [(r["shape"], r["direction"], r["status"], r["plan"]["gluon"], r["plan"]["fused"]) for r in recs] == [
        ("1,6:2,24,24,16/causal/bfloat16", "fwd+bwd", "ok", 0, False)]
