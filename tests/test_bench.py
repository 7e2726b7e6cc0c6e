"""The benchmark commands' plumbing at tiny sizes on the CPU (the numbers mean nothing there)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

import kernels
from harness.bench.softmax import KernelRow, fill_ratios, run_kernel_bench


@pytest.mark.slow  # every softmax method through the interpreter and a chart (~6 s)
def test_kernel_bench_writes_table_csv_and_chart(tmp_path):
    methods = [m for m in ("naive", "torch", "triton") if m in kernels.runnable_methods()]
    res = run_kernel_bench(methods, [8, 32], 256, "fp32", [], (1, 2, 8, 8), tmp_path, rep_ms=10)
    assert res.copy_gbs > 0
    assert len(res.rows) == 2 * len(methods) and all(r.correct for r in res.rows), res.rows
    assert all(r.fwd_gbs and r.bwd_gbs and r.fwd_frac_copy for r in res.rows)
    # the host's issue time, beside eager, where the GPU runs asynchronously (never a CPU figure)
    assert all((r.fwd_host_us is not None) == (r.fwd_bwd_host_us is not None) == torch.cuda.is_available()
               for r in res.rows)
    # eager always; graph replay only where CUDA graphs exist (never a number made up for the CPU)
    assert all((r.fwd_graph_gbs is not None) == torch.cuda.is_available() for r in res.rows)
    for name in ("kernels.md", "kernels.csv", "kernels.json", "kernels.png"):
        assert (tmp_path / name).stat().st_size > 0
    with open(tmp_path / "kernels.csv") as f:
        assert len(list(csv.DictReader(f))) == len(res.rows)
    md = (tmp_path / "kernels.md").read_text()
    assert "Copy ceiling" in md and "Attention-shaped" in md
    assert [a["method"] for a in res.attention] == methods
    if "triton" in methods:  # the causal forward's memory floor (a traffic-only kernel, checked inside)
        assert res.causal_floor_ms and res.causal_floor_ms > 0 and "memory floor" in md


def test_wrong_method_gets_no_ratio():
    rows = [
        KernelRow("torch", "bfloat16", 128, 8, False, fwd_gbs=100.0, bwd_gbs=100.0, correct=True),
        KernelRow("fast", "bfloat16", 128, 8, False, fwd_gbs=400.0, bwd_gbs=400.0, correct=False),
        KernelRow("good", "bfloat16", 128, 8, False, fwd_gbs=200.0, bwd_gbs=50.0, correct=True),
    ]
    fill_ratios(rows, copy_gbs=1000.0)
    assert rows[1].fwd_vs_best_baseline is None and rows[1].fwd_frac_copy == 0.4
    assert rows[2].fwd_vs_best_baseline == 2.0 and rows[2].bwd_vs_best_baseline == 0.5


def test_sweep_candidates_cover_the_launch_tables():
    """The CUDA sweep times what the launch table may pick: every CUDA table entry is among the variants,
    every variant is launchable (threads per row within a block, a cluster of 2-16 CTAs). (The Triton
    sweep's candidates: tests/test_triton_sweep.py.)"""
    from harness.bench.tuning.cuda_sweep import cuda_variants

    for n, items in ((128, {8, 16, 32, 64}), (1000, {8, 16, 32, 64}), (16384, {16, 32, 64})):
        vs = cuda_variants(n)
        assert {v["items"] for v in vs if v["path"] == "register"} == items  # 8 at 16384: 2048 threads
        assert {(v["merged"], v["packed"]) for v in vs if v["dir"] == "fwd"} == {
            (False, False), (False, True), (True, False), (True, True)}
    long = cuda_variants(262144, rows=512)
    assert long and {v["path"] for v in long} == {"cluster", "split", "persist"}
    assert all(2 <= -(-262144 // (v["threads"] * v["items"])) <= (16 if v["path"] == "cluster" else 128)
               for v in long if v["path"] != "persist")
    assert all(v["ctas"] == 8 for v in long if v["path"] == "persist")  # 8 x 1024 x 32
    # the forward table's 16-bit long rows: 32768 in registers (1024 x 32, merged, packed), 32769-65536
    # hybrid (512 x 64 packed in registers, the rest in shared memory; also timed against the persistent
    # kernel it replaced, 1024 x 64), split slices of 512 x 32 (packed)
    assert {"path": "register", "items": 32, "threads": 0, "buffers": 0, "ctas": 1, "dir": "fwd",
            "merged": True, "packed": True} in cuda_variants(32768)
    for n in (32769, 49152, 65536):
        assert {"path": "hybrid", "items": 64, "threads": 512, "buffers": 0, "ctas": 1, "dir": "fwd",
                "merged": True, "packed": True} in cuda_variants(n)
    assert not any(v["path"] == "hybrid" for n in (32768, 65537) for v in cuda_variants(n))
    assert {"path": "persist", "items": 64, "threads": 1024, "buffers": 1, "ctas": 1, "dir": "fwd",
            "merged": True, "packed": True} in cuda_variants(65536)
    assert {"path": "split", "items": 32, "threads": 512, "buffers": 0, "ctas": 1, "dir": "fwd",
            "merged": True, "packed": True} in long
    # and, for 65536, two-CTA clusters of 512 x 64 packed (two CTAs per SM: persist_min_blocks)
    assert {"path": "persist", "items": 64, "threads": 512, "buffers": 1, "ctas": 2, "dir": "fwd",
            "merged": True, "packed": True} in cuda_variants(65536)
    # backward 16384 one CTA of 1024 threads
    assert {"path": "persist", "items": 16, "threads": 1024, "buffers": 1, "ctas": 1, "dir": "bwd",
            "cap": False} in cuda_variants(16384)
    # the backward cluster path of the table: 512 threads x 32 elements per CTA, capped registers
    for n in (32768, 65536, 131072):
        assert {"path": "cluster", "items": 32, "threads": 512, "buffers": 0, "ctas": 1, "dir": "bwd",
                "cap": True} in cuda_variants(n)
    assert any(v["path"] == "split" and v["threads"] == 512 and v["items"] == 16 for v in long)  # the table's
    assert all(v["merged"] for v in long if v["path"] == "split" and v["dir"] == "fwd")  # split: one exchange


def test_profile_script_runs_a_method(capsys):
    """scripts/profile_softmax.py (what `scripts/device.sh profile` runs under ncu): forward and
    backward of a method on rows x N, and a clear error for impossible sizes."""
    import runpy

    mod = runpy.run_path(str(Path(__file__).resolve().parent.parent / "scripts" / "profile_softmax.py"))
    mod["main"](["--method", "torch", "--n", "256", "--elements", "4096", "--direction", "both", "--causal",
                 "--repeat", "2"])
    assert "torch: 2 x both on 16 x 256 bfloat16" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        mod["main"](["--method", "torch", "--n", "256", "--elements", "100"])


def test_default_benchmark_lists_are_every_method_that_provides_the_op():
    from harness.bench import attention, launch, loss, softmax

    assert set(softmax.default_methods()) == {
        n for n, a in kernels.available_methods(op="softmax").items() if a.available and a.ops["softmax"] == "native"}
    assert "sdpa" in attention.default_methods() and "torch" in attention.default_methods()  # native and composed
    assert "floor" in launch.default_methods() and "floor" not in softmax.default_methods()  # timing-only: host cost only
    assert set(loss.default_methods()) == set(kernels.runnable_methods(op="cross_entropy"))


def test_attention_table_checks_and_skips(tmp_path):
    from harness.bench.attention import run_attention_bench

    rows = run_attention_bench(["torch", "sdpa"], [(1, 2, 16, 8)], tmp_path, rep_ms=5)
    assert [r.method for r in rows] == ["torch", "sdpa"] and all(r.correct for r in rows), rows
    assert all(r.fwd_tflops and r.fwd_bwd_tflops for r in rows)
    assert all((r.fwd_host_us is not None) == (r.fwd_bwd_host_us is not None) == torch.cuda.is_available() for r in rows)
    assert "host us fwd / fwd+bwd" in (tmp_path / "attention.md").read_text()
    assert rows[0].provided == "composed" and rows[1].provided == "native"
    assert "TFLOP/s" in (tmp_path / "attention.md").read_text() and (tmp_path / "attention.csv").exists()


def test_attention_table_in_the_models_layout(tmp_path):
    """layout qkv: one projection and its gradient; flash by its attention_qkv, sdpa on split views."""
    from harness.bench.attention import run_attention_bench

    methods = [m for m in ("sdpa", "flash") if m in kernels.runnable_methods(op="attention")]
    rows = run_attention_bench(methods, [(1, 2, 16, 8)], tmp_path, rep_ms=5, layout="qkv")
    assert all(r.correct and r.fwd_bwd_tflops for r in rows), rows
    want = {"sdpa": "native, split", "flash": "native (qkv)"}
    assert {r.method: r.provided for r in rows} == {m: want[m] for m in methods}
    assert "its gradient" in (tmp_path / "attention-qkv.md").read_text() and not (tmp_path / "attention.md").exists()
    assert all(r.layout == "qkv" for r in rows)
    # the Triton launches of one forward + backward, by path: none for sdpa; flash's kernels set aside in the
    # interpreter, and on a GPU, once warm, every one prepared or direct (none through kernel[grid])
    launches = {r.method: r.launches for r in rows}
    assert launches.get("sdpa", "-") == "-"
    if "flash" in launches:
        from kernels.runtime import fastlaunch

        if fastlaunch.unsupported_reason():
            assert launches["flash"].startswith(fastlaunch.PLAIN_ASIDE), launches
        else:
            assert launches["flash"] != "-" and "plain" not in launches["flash"], launches
    with pytest.raises(ValueError, match="layout 'bhtd' is not accepted: one of separate, qkv"):
        run_attention_bench(methods, [(1, 2, 16, 8)], tmp_path, layout="bhtd")


def test_loss_table_runs_every_cross_entropy_method(tmp_path):
    from harness.bench.loss import run_loss_bench

    # every method's plumbing; `compile` would only add Inductor compile time here (its cross-entropy is
    # checked in tests/test_cross_entropy.py)
    methods = [m for m in kernels.runnable_methods(op="cross_entropy") if m != "compile"]
    if not methods:
        pytest.skip("no method implements cross_entropy here")
    rows = run_loss_bench(methods, [17, 33], 16, (8, 12, 33), tmp_path, rep_ms=5)
    ce = [r for r in rows if r.op == "cross_entropy" and not r.autocast]
    assert {r.method for r in ce} == set(methods) and all(r.correct for r in ce), ce
    # measured largest first (the cleanest memory), reported by V, the linear rows last
    assert [r.vocab for r in rows if r.op == "cross_entropy"] == sorted(r.vocab for r in rows if r.op == "cross_entropy")
    assert rows[-1].op == "linear_cross_entropy" and all((r.held_gib is not None) == torch.cuda.is_available() for r in rows)
    assert all(r.fwd_bwd_ms and r.ideal_ms and r.frac_ideal for r in ce)
    assert all((r.fwd_bwd_host_us is not None) == torch.cuda.is_available() for r in ce)
    assert "ideal" in (tmp_path / "loss.md").read_text()


def test_launch_table_reports_host_time_per_call(tmp_path):
    from harness.bench.launch import run_launch_bench

    rows = run_launch_bench(["torch", "sdpa"], tmp_path, calls=5)
    host = [r for r in rows if r.method.startswith("host: ")]
    rows = [r for r in rows if not r.method.startswith("host: ")]
    assert {(r.method, r.op) for r in rows} == {("torch", "softmax"), ("torch", "cross_entropy"), ("sdpa", "attention")}
    assert all(r.one_shot_us > 0 and r.bound_us > 0 and r.bound_fwd_bwd_us > 0 and not r.error for r in rows), rows
    # the host's own floor, same run: bare torch.softmax and an identity autograd.Function
    assert [r.method for r in host] == ["host: torch.softmax", "host: identity Function"]
    assert all(r.bound_us > 0 and r.bound_fwd_bwd_us > 0 and r.one_shot_us is None and not r.error for r in host), host
    assert "host: identity Function" in (tmp_path / "launch.md").read_text()
    assert "one-shot / bound" in (tmp_path / "launch.md").read_text() and "| launch |" in (tmp_path / "launch.md").read_text()


def test_launch_table_keeps_the_rows_of_a_run_cut_short(tmp_path, monkeypatch):
    """A time limit that stops the benchmark mid-way (run W on the H200) leaves the host's floor and every
    row measured before it in launch.md and launch.json."""
    from harness.bench import launch

    measure = launch._measure

    def cut(row, method, op, device, calls):
        if method == "sdpa":
            raise KeyboardInterrupt  # what a timeout's signal does to the process
        measure(row, method, op, device, calls)

    monkeypatch.setattr(launch, "_measure", cut)
    with pytest.raises(KeyboardInterrupt):
        launch.run_launch_bench(["torch", "sdpa"], tmp_path, calls=3)
    table = (tmp_path / "launch.md").read_text()
    assert "host: torch.softmax" in table and "host: identity Function" in table and "| torch |" in table
    assert "| sdpa |" not in table
    saved = json.loads((tmp_path / "launch.json").read_text())["rows"]
    assert [r["method"] for r in saved] == ["host: torch.softmax", "host: identity Function", "torch", "torch"]


def test_loss_table_shows_a_measurement_error_even_after_a_correct_check(tmp_path, monkeypatch):
    from harness.bench import loss

    def boom(*a, **k):
        raise RuntimeError("CUDA out of memory (simulated)")

    monkeypatch.setattr(loss, "eager_and_graph_ms", boom)  # (this process only: no child processes)
    rows = loss.run_loss_bench(["torch"], [33], 16, None, tmp_path, rep_ms=5, isolate=False)
    assert rows[0].correct and "out of memory" in rows[0].error
    assert "error: RuntimeError: CUDA out of memory" in (tmp_path / "loss.md").read_text()


def test_a_loss_bench_stopped_midway_leaves_the_rows_it_measured(tmp_path, monkeypatch, capsys):
    """Each vocabulary's rows are printed and the table written as soon as they are measured: a bench killed
    at a time limit (SIGTERM, a device call's timeout) leaves them."""
    from harness.bench import loss

    real = loss._vocab_rows

    def stop_at_the_second(methods, tokens, v, *rest):
        if v == 17:
            raise KeyboardInterrupt  # (the second vocabulary: the largest come first)
        return real(methods, tokens, v, *rest)

    monkeypatch.setattr(loss, "_vocab_rows", stop_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        loss.run_loss_bench(["torch"], [33, 17], 16, None, tmp_path, rep_ms=5, isolate=False)
    assert "torch" in capsys.readouterr().out
    table = (tmp_path / "loss.md").read_text()
    assert "| torch | cross_entropy | 16 x 33 |" in table and "16 x 17" not in table


def test_launch_table_measures_both_triton_launch_paths():
    """The triton method is measured once per launch path (direct, plain); where the direct path cannot
    run (the interpreter) its label says why; other methods once."""
    from harness.bench.launch import _launch_paths
    from kernels.runtime import fastlaunch

    paths = _launch_paths("triton")
    assert [d for _, d in paths] == [True, False] and paths[1][0] == "plain"
    assert (paths[0][0] == "direct") == (fastlaunch.unsupported_reason() is None)
    assert _launch_paths("torch") == [("", None)]


def test_error_text_keeps_the_allocator_account_of_an_out_of_memory_error():
    """A table row that ran out of memory says how much PyTorch allocated and reserved (whose memory
    filled the GPU), which CUDA's message gives past the first 200 characters; other errors: one line."""
    from harness.bench.common import error_text

    msg = ("CUDA out of memory. Tried to allocate 1024.00 MiB. GPU 0 has a total capacity of 139.80 GiB of which "
           "119.12 MiB is free. Including non-PyTorch memory, this process has 139.68 GiB memory in use. Of the "
           "allocated memory 1.00 GiB is allocated by PyTorch, and 2.50 GiB is reserved by PyTorch but unallocated. "
           "If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF")
    text = error_text(torch.OutOfMemoryError(msg))
    assert text.startswith("OutOfMemoryError: CUDA out of memory.") and len(text) < 400
    assert "1.00 GiB is allocated by PyTorch, and 2.50 GiB is reserved by PyTorch but unallocated" in text
    assert error_text(ValueError("short\nsecond line")) == "ValueError: short"


@pytest.mark.slow  # a subprocess per group (~8 s)
def test_loss_table_measures_each_group_in_its_own_process(tmp_path):
    """isolate=True (the GPU default): each vocabulary's rows and the linear rows come back from a fresh
    process, checked and timed as in-process ones are."""
    from harness.bench import loss

    import os

    assert loss._isolated(True, os.getpid) != os.getpid() and loss._isolated(False, os.getpid) == os.getpid()
    rows = loss.run_loss_bench(["torch"], [33], 16, (8, 12, 33), tmp_path, rep_ms=5, isolate=True)
    assert [(r.method, r.op, r.autocast) for r in rows] == [
        ("torch", "cross_entropy", False), ("torch", "cross_entropy", True), ("torch", "linear_cross_entropy", False)]
    assert all(r.correct and r.fwd_bwd_ms and not r.error for r in rows)


def test_loss_table_says_when_a_group_process_dies(tmp_path, monkeypatch):
    from harness.bench import loss

    def dies(isolate, fn, *args):
        raise RuntimeError("A process in the process pool was terminated abruptly")

    monkeypatch.setattr(loss, "_isolated", dies)
    rows = loss.run_loss_bench(["torch"], [33], 16, (8, 12, 33), tmp_path, rep_ms=5)
    assert [(r.op, r.tokens) for r in rows] == [("cross_entropy", 16), ("linear_cross_entropy", 8)]
    assert all("the measuring process failed" in r.error and "terminated abruptly" in r.error for r in rows)
    assert "the measuring process failed" in (tmp_path / "loss.md").read_text()


def test_attention_profile_script_runs_a_method_and_flash_plans(capsys, monkeypatch):
    """scripts/profile_attention.py (what `scripts/device.sh profile-attention` runs under ncu): a method's
    causal forward and backward at (B, H, T, d); for flash, plan knobs over the table's plan (printed, and
    the plans the kernels then get); clear errors for a bad shape, knobs that make no plan and knobs for
    another method."""
    import runpy

    mod = runpy.run_path(str(Path(__file__).resolve().parent.parent / "scripts" / "profile_attention.py"))
    mod["main"](["--method", "torch", "--shape", "1,2,16,8", "--direction", "both", "--repeat", "2", "--dtype", "float32"])
    assert "torch: 2 x both at (1, 2, 16, 8) float32 (causal)" in capsys.readouterr().out
    from kernels.methods.flash import fwd

    fp, bp = mod["_plans"]((1, 2, 64, 64), torch.bfloat16, "block_m=32 num_warps=2", "fused=0 dq_mode=atomic",
                           pytest.fail)
    assert (fp.block_m, fp.num_warps, bp.dq_mode) == (32, 2, "atomic")
    got = []  # the plan the flash forward then runs (the kernel launch itself stood in for)
    monkeypatch.setattr(fwd.fastlaunch, "launch", lambda fn, grid, args, kw, *rest: got.append(kw))
    mod["main"](["--shape", "1,2,64,64", "--fwd", "block_m=32 block_n=16 num_warps=2", "--repeat", "1"])
    assert "flash plans: FwdPlan(block_m=32, block_n=16, num_warps=2" in capsys.readouterr().out
    assert got and all(kw["BLOCK_M"] == 32 and kw["BLOCK_N"] == 16 and kw["num_warps"] == 2 for kw in got)
    for bad in (["--shape", "1,2,16"], ["--shape", "1,2,16,8", "--repeat", "0"],
                ["--method", "torch", "--fwd", "block_m=32"], ["--fwd", "block_m=31"], ["--fwd", "block_m=32,64"]):
        with pytest.raises(SystemExit):
            mod["main"](bad)


@pytest.mark.slow  # a whole-model compile on the CPU (~8 s)
def test_overhead_bare_loop_compiles_the_model_as_the_harness_does(monkeypatch):
    """With compile_model the bare loop's model goes through torch.compile with the run's compile_mode, as
    the harness's does (else the overhead table sets a compiled harness against an eager loop); without it,
    not at all."""
    from harness.bench.overhead import bare_loop_tokens_per_s
    from tests.test_accel_loss_method import compose_cfg

    compiled = []

    def fake_compile(model, mode="default"):
        compiled.append((type(model).__name__, mode))
        return model

    monkeypatch.setattr(torch, "compile", fake_compile)
    base = ("model=tiny", "trainer=cpu", "data=synthetic", "logger=none")
    assert bare_loop_tokens_per_s(compose_cfg(*base), steps=1, warmup=1) > 0
    assert compiled == []
    cfg = compose_cfg(*base, "compile_model=true", "compile_mode=max-autotune")
    assert bare_loop_tokens_per_s(cfg, steps=1, warmup=1) > 0
    assert compiled == [("GPT", "max-autotune")]


def test_one_table_of_benchmarks_lists_and_runs_every_command(capsys):
    """``python -m harness.bench --help`` lists every benchmark and tuning tool of the table (the old
    names among them), importing none of their modules; each command's own --help gives its arguments;
    every module in the table has the two functions the table calls."""
    import importlib
    import os
    import sys

    from harness.bench import BENCHMARKS, main

    assert {"kernels", "loss", "attention", "launch", "host-profile", "overhead", "triton-sweep", "cuda-sweep",
            "triton-ce-sweep", "cuda-ce-sweep", "flash-sweep", "flash-compile-check"} <= set(BENCHMARKS)
    before = set(sys.modules)
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert all(name in out for name in BENCHMARKS), out
    assert not {b.module for b in BENCHMARKS.values()} & (set(sys.modules) - before)
    with pytest.raises(SystemExit) as e:
        main(["launch", "--help"])
    assert e.value.code == 0 and "--calls" in capsys.readouterr().out
    for name, bench in BENCHMARKS.items():
        if name == "flash-compile-check" and os.environ.get("TRITON_INTERPRET") == "1":
            continue  # (it compiles for a GPU target: it refuses Triton's interpreter at import)
        module = importlib.import_module(bench.module)
        assert callable(module.add_arguments) and callable(module.run), name
