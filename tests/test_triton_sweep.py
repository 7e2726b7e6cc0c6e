"""The Triton launch-table sweep (``harness.bench.tuning.triton_sweep``, ``python -m harness.bench
triton-sweep``): its candidates cover the tables' choices, and its plumbing at tiny sizes (on a CPU in
Triton's interpreter; the timings mean nothing there)."""

from __future__ import annotations

import pytest

import kernels
from harness.bench.tuning import triton_sweep as sweep
from harness.bench.tuning.triton_sweep import triton_candidates
from kernels.methods.triton.softmax import plan as tp


def test_sweep_candidates_cover_the_launch_tables():
    """The sweep times what the launch tables may pick: every table choice for long rows, and the
    causal candidates include the table's causal choice."""
    for n in (32768, 65536, 262144):  # every table choice for long rows is a sweep candidate
        assert tp.plan(n, 2) in triton_candidates(n) and tp.plan(n, 2, backward=True) in triton_candidates(n)

    for t in (128, 256, 512, 1024, 2048, 4096, 8192, 16384):  # every causal table choice too, both directions
        causal = triton_candidates(t, causal=True)
        assert tp.plan(t, 2, causal=True) in causal and tp.plan(t, 2, backward=True, causal=True) in causal
    causal = triton_candidates(1024, causal=True)
    assert tp.plan(1024, 2, causal=True) != tp.plan(1024, 2)  # causal rows have their own entry
    assert tp.plan(1024, 2, causal=True).fill and not tp.plan(1024, 2, backward=True, causal=True).fill
    assert any(p.fill for p in causal) and any(not p.round_mask for p in causal)


@pytest.mark.slow  # every sweep candidate through the interpreter (~5 s)
@pytest.mark.skipif("triton" not in kernels.runnable_methods(), reason="triton cannot run here")
def test_triton_sweep_checks_every_candidate(monkeypatch, tmp_path):
    """The sweep's plumbing at tiny sizes (on a CPU, Triton's interpreter; the timings mean nothing):
    every candidate is checked forward and backward against the float64 references, and a wrong
    candidate is marked wrong rather than timed as a winner."""
    good = {128: [tp.Plan(False, 128, 4, 1)], 16: [tp.Plan(False, 16, 2, 1, round_mask=False)]}

    def candidates(n, causal=False):
        bad = tp.Plan(False, good[n][0].block_n // 2, 2, 1)  # half the row: a wrong softmax
        return good[n] + [bad]

    monkeypatch.setattr(sweep, "triton_candidates", candidates)
    rows = sweep.run_triton_sweep([128], 128 * 8, "bf16", tmp_path, [(1, 2, 16, 16)])
    assert [(r["n"], r["causal"]) for r in rows] == [(128, False), (128, False), (16, True), (16, True)]
    for good_row, bad_row in (rows[0:2], rows[2:4]):
        assert good_row["fwd_ok"] and good_row["bwd_ok"] and good_row["fwd_gbs"] > 0
        assert not (bad_row.get("fwd_ok") and bad_row.get("bwd_ok"))  # wrong, or failed (an error noted)
        assert bad_row.get("fwd_ok") is False or "fwd_error" in bad_row
    assert (tmp_path / "triton_sweep.json").exists()


@pytest.mark.skipif("triton" not in kernels.runnable_methods(), reason="triton cannot run here")
def test_triton_sweep_command_line(monkeypatch, tmp_path, capsys):
    """The command line (``python -m harness.bench triton-sweep``) takes the sweep's arguments, runs the
    sweep and rejects a malformed --causal."""
    from harness.bench import main

    monkeypatch.setattr(sweep, "triton_candidates", lambda n, causal=False: [tp.Plan(False, 16, 2, 1)])
    run = lambda args: main(["triton-sweep", *args])  # noqa: E731
    run(["--sizes", "16", "--elements", "32", "--causal", "1,1,16,16", "--match", "rows=2", "--out", str(tmp_path)])
    assert (tmp_path / "triton_sweep.json").exists()
    assert "N=16 " in capsys.readouterr().out
    with pytest.raises(SystemExit):
        run(["--causal", "8", "--out", str(tmp_path)])
