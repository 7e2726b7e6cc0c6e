"""The flash method (kernels/methods/flash): output and the three gradients against float64, the
causal and boundary cases, layouts, dtypes, head dims, the errors, the torch ops, the launch plans.

On the CPU these run in Triton's interpreter with tiny shapes and 16-wide blocks forced through the
plan (so every shape spans several blocks and ragged edges); the GPU-marked tests run full sizes.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import kernels
from kernels.methods.flash import plan as plans
from kernels.methods.flash.fwd import launch_fwd, resolve_tma
from kernels.methods.flash.tiles import tma_supported

pytestmark = pytest.mark.skipif("flash" not in kernels.runnable_methods(op="attention"),
                                reason="flash cannot run here")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SMALL_FWD = plans.FwdPlan(block_m=16, block_n=16)
SMALL_BWD = plans.BwdPlan(block_m1=16, block_n1=16, block_m2=16, block_n2=16, pre_block=16)
SMALL = (SMALL_FWD, SMALL_BWD)


def make_qkv(B, H, tq, tk, d, dtype, layout="bhtd", dv=None, spread=1.0, seed=0, device=DEVICE):
    """q (B, H, Tq, d), k (B, H, Tk, d), v (B, H, Tk, dv); layout 'bthd': views of (B, T, H, d)
    tensors transposed, as the model makes them; 'qkv': q, k, v slices of one fused projection."""
    g = torch.Generator().manual_seed(seed)
    dv = dv or d

    def rand(*shape):
        return (torch.randn(*shape, generator=g) * spread).to(device=device, dtype=dtype)

    if layout == "qkv":
        assert tq == tk and dv == d
        qkv = rand(B, tq, 3 * H * d)  # the model's c_attn output, split and viewed
        q, k, v = (t.view(B, tq, H, d).transpose(1, 2) for t in qkv.split(H * d, dim=2))
    elif layout == "bthd":
        q, k, v = rand(B, tq, H, d).transpose(1, 2), rand(B, tk, H, d).transpose(1, 2), rand(B, tk, H, dv).transpose(1, 2)
    else:
        q, k, v = rand(B, H, tq, d), rand(B, H, tk, d), rand(B, H, tk, dv)
    return [t.detach().requires_grad_(True) for t in (q, k, v)]


def run_and_compare(q, k, v, causal=True, scale=None, plan=SMALL):
    """Forward + backward through kernels.attention under ``plan``; returns the errors of out, dq, dk,
    dv against float64 (asserted within the attention tolerances) and the results."""
    with plans.override(*plan):
        out = kernels.attention(q, k, v, causal=causal, scale=scale, method="flash")
        do = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device, out.dtype)
        out.backward(do)
    assert out.dtype == q.dtype and out.shape == (*q.shape[:-1], v.shape[-1])
    ref_in = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    ref = kernels.reference_attention(*ref_in, scale=scale, causal=causal)
    ref.backward(do.double())
    got = [out, q.grad, k.grad, v.grad]
    want = [ref] + [t.grad for t in ref_in]
    for name, g in zip(("out", "dq", "dk", "dv"), got):
        assert torch.isfinite(g).all(), f"{name} has NaN or inf"
    errs = [kernels.relative_error(g, w) for g, w in zip(got, want)]
    # the attention tolerances, or 3x the error of merely rounding the exact result (long fp16 rows)
    tols = [max(kernels.ATTN_FWD_TOL[q.dtype], 3 * kernels.rounding_floor(want[0].detach(), q.dtype))]
    tols += [max(kernels.ATTN_BWD_TOL[q.dtype], 3 * kernels.rounding_floor(w, q.dtype)) for w in want[1:]]
    for name, e, t in zip(("out", "dq", "dk", "dv"), errs, tols):
        assert e <= t, f"{name}: relative error {e:.2e} > {t:.2e}"
    return errs, got


CASES = [  # (B, H, Tq, Tk, d, dtype, causal)
    (1, 2, 1, 1, 16, torch.float16, True),  # T = 1
    (1, 1, 1, 1, 32, torch.bfloat16, False),
    (2, 2, 37, 37, 16, torch.float16, True),  # odd T, not a multiple of the block
    (1, 2, 37, 37, 32, torch.bfloat16, False),
    (1, 2, 48, 48, 16, torch.bfloat16, True),  # a multiple of the block
    (1, 2, 20, 45, 32, torch.float16, True),  # Tq < Tk: bottom-right aligned diagonal
    (1, 2, 20, 45, 16, torch.bfloat16, False),
    (1, 2, 45, 20, 16, torch.float16, True),  # Tq > Tk: the first 25 queries see no key
    (1, 2, 45, 20, 32, torch.bfloat16, False),
    (1, 1, 3, 40, 16, torch.bfloat16, True),  # a few queries, many keys
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[2]}x{c[3]}-d{c[4]}-{str(c[5])[6:]}-{'causal' if c[6] else 'full'}")
def test_matches_float64(case):
    B, H, tq, tk, d, dtype, causal = case
    run_and_compare(*make_qkv(B, H, tq, tk, d, dtype), causal=causal)


@pytest.mark.parametrize("d", [16, 32, 64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_head_dims(d, dtype):
    run_and_compare(*make_qkv(1, 1, 19, 19, d, dtype, seed=d), causal=True)


def test_padded_head_dims_and_a_different_value_dim():
    # d = 80 padded to 128 tiles with masked loads; v's head dim 24 (padded to 32) differs from d
    run_and_compare(*make_qkv(1, 2, 23, 23, 80, torch.float16, dv=24), causal=True)
    run_and_compare(*make_qkv(1, 1, 17, 30, 5, torch.bfloat16), causal=False)


@pytest.mark.parametrize("layout", ["bthd", "qkv"])
def test_strided_views_are_read_in_place(layout):
    q, k, v = make_qkv(2, 3, 21, 21, 16, torch.bfloat16, layout=layout)
    assert not q.is_contiguous()
    run_and_compare(q, k, v, causal=True)


def test_rows_with_no_key_get_zeros_and_zero_gradient():
    q, k, v = make_qkv(1, 2, 40, 13, 16, torch.float16)
    _, (out, dq, dk, dv) = run_and_compare(q, k, v, causal=True)
    empty = 40 - 13  # queries 0 .. 26 see no key
    assert (out[:, :, :empty] == 0).all() and (dq[:, :, :empty] == 0).all()
    assert out[:, :, empty:].abs().sum() > 0
    with plans.override(*SMALL):
        _, lse = launch_fwd(q.detach(), k.detach(), v.detach(), 0.25, True)
    assert torch.isposinf(lse[:, :, :empty]).all() and torch.isfinite(lse[:, :, empty:]).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_large_scores(dtype):
    """Inputs of magnitude ~30: scaled scores in the thousands, rows nearly one-hot; exp2 of the
    shifted scores must neither overflow nor lose the max. dq and dk of a nearly one-hot row are
    tiny differences dP - delta, and delta = rowsum(do * out) uses the stored (rounded) output, as
    every fused attention's backward does; in bf16 that rounding alone is ~0.2 of such a gradient.
    So dq and dk are checked against the float64 gradient with delta taken from the kernel's own out,
    out and dv against the exact float64 ones."""
    q, k, v = make_qkv(1, 2, 33, 33, 32, dtype, spread=30.0)
    with plans.override(*SMALL):
        out = kernels.attention(q, k, v, method="flash")
        do = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device, dtype)
        out.backward(do)
    q64, k64, v64, do64 = (t.detach().double() for t in (q, k, v, do))
    scale = q.shape[-1] ** -0.5
    p = kernels.reference_softmax(q64 @ k64.transpose(-2, -1), scale=scale, causal=True)
    ds = p * (do64 @ v64.transpose(-2, -1) - (do64 * out.detach().double()).sum(-1, keepdim=True))
    assert kernels.relative_error(out, p @ v64) <= kernels.ATTN_FWD_TOL[dtype]
    assert kernels.relative_error(v.grad, p.transpose(-2, -1) @ do64) <= kernels.ATTN_BWD_TOL[dtype]
    assert kernels.relative_error(q.grad, scale * ds @ k64) <= kernels.ATTN_BWD_TOL[dtype]
    assert kernels.relative_error(k.grad, scale * ds.transpose(-2, -1) @ q64) <= kernels.ATTN_BWD_TOL[dtype]


@pytest.mark.parametrize("scale", [None, 0.3, -0.2, 0.0])
def test_scale_given_or_default(scale):
    run_and_compare(*make_qkv(1, 1, 25, 25, 16, torch.float16, seed=3), causal=True, scale=scale)


def test_float32_is_exact_to_the_fp32_tolerance():
    errs, _ = run_and_compare(*make_qkv(1, 2, 29, 29, 16, torch.float32), causal=True)
    assert max(errs) < 1e-5  # full-precision dots (no tf32)


@pytest.mark.parametrize("variant", ["tma-host", "tma-device", "fused", "fused-tma-host", "mixed-blocks", "atomic-dq",
                                     "atomic-dq-tma-host", "tma_add-dq"])
def test_plan_variants(variant):
    f, b = SMALL
    if variant.startswith(("atomic-dq", "tma_add")):  # dq added by the dk/dv programs (a 37 x 30 causal block pattern)
        b = dataclasses.replace(b, dq_mode=variant.split("-")[0], block_n1=32 if variant.endswith("host") else 16,
                                tma="host" if variant.endswith("host") else "off")
    elif variant.startswith("tma"):
        mode = variant.split("-")[1]
        f, b = dataclasses.replace(f, tma=mode), dataclasses.replace(b, tma=mode)
    elif variant == "fused":
        b = dataclasses.replace(b, fused=True)
    elif variant == "fused-tma-host":
        f, b = dataclasses.replace(f, tma="host"), dataclasses.replace(b, tma="host", fused=True, block_n1=32)
    else:
        f = plans.FwdPlan(block_m=32, block_n=16)
        b = plans.BwdPlan(block_m1=16, block_n1=32, block_m2=32, block_n2=16, pre_block=32)
    run_and_compare(*make_qkv(1, 2, 37, 30, 16, torch.float16), causal=True, plan=(f, b))


@pytest.mark.parametrize("group", [2, 4, 8])
@pytest.mark.parametrize("tq,tk", [(37, 30), (30, 37)])
def test_grouped_causal_program_order(group, tq, tk):
    """FwdPlan.group: the causal forward's programs remapped G heads at a time, heaviest blocks first.
    6 heads (B = 2, H = 3): groups of 2 (even), of 4 (the last group short: 2 heads) and of 8 (one
    group of all 6); every (query block, head, batch) tile must still be computed exactly once."""
    f = dataclasses.replace(SMALL_FWD, group=group)
    run_and_compare(*make_qkv(2, 3, tq, tk, 16, torch.float16, layout="bthd"), causal=True, plan=(f, SMALL_BWD))


@pytest.mark.parametrize("mode", ["atomic", "tma_add"])
@pytest.mark.parametrize("causal", [True, False])
def test_atomic_dq_with_a_padded_head_dim(causal, mode):
    """dq by atomic adds with a padded head dim (24 in tiles of 32) and partial query blocks (41 rows in
    blocks of 16, whose rows past Tq the mask, or the descriptor's bounds, keep inside the fp32 buffer)."""
    b = dataclasses.replace(SMALL_BWD, dq_mode=mode)
    run_and_compare(*make_qkv(2, 2, 41, 23, 24, torch.bfloat16, layout="bthd"), causal=causal, plan=(SMALL_FWD, b))


def test_atomic_dq_gives_way_to_the_dq_pass_in_deterministic_mode():
    """Under torch.use_deterministic_algorithms an atomic-dq plan (either kind) runs the (deterministic) dq
    pass: the gradients equal the pass plan's bit for bit."""
    grads = {}
    for name, b in (("pass", SMALL_BWD), ("atomic", dataclasses.replace(SMALL_BWD, dq_mode="atomic")),
                    ("tma_add", dataclasses.replace(SMALL_BWD, dq_mode="tma_add"))):
        q, k, v = make_qkv(1, 2, 37, 37, 16, torch.bfloat16)
        was = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True, warn_only=True)  # (the float64 reference's cuBLAS on a GPU)
        try:
            _, got = run_and_compare(q, k, v, causal=True, plan=(SMALL_FWD, b))
        finally:
            torch.use_deterministic_algorithms(was)
        grads[name] = got[1:]
    for mode in ("atomic", "tma_add"):
        assert all(torch.equal(a, p) for a, p in zip(grads[mode], grads["pass"]))


def test_dq_adds_compile_to_what_each_mode_promises():
    """Compiled for sm_90 (no GPU: kernels.methods.flash.compile_check in a subprocess without the
    interpreter, HARNESS_COMPILE_PYTHON's Triton where set): the atomic mode's dk/dv kernel adds dq by
    vector fp32 atomics, tma_add's by bulk tensor reductions and no element atomic."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
    python = os.environ.get("HARNESS_COMPILE_PYTHON") or sys.executable
    lines = {}
    for mode in ("atomic", "tma_add"):
        run = subprocess.run([python, "-m", "kernels.methods.flash.compile_check", "--d", "64", "--bwd",
                              f"dq_mode={mode}"], capture_output=True, text=True, env=env, timeout=600)
        assert run.returncode == 0, run.stderr[-2000:]
        lines[mode] = next(line for line in run.stdout.splitlines() if line.strip().startswith("dk/dv"))
    assert "FAILED" not in lines["atomic"] + lines["tma_add"], lines
    vector_add = re.compile(r"\b(atom|red)\.global\.gpu\.relaxed\.add\.v4\.f32")  # (red: 3.9, atom: 3.6)
    assert vector_add.search(lines["atomic"]) and "cp.reduce" not in lines["atomic"], lines["atomic"]
    assert "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add" in lines["tma_add"], lines["tma_add"]
    assert not re.search(r"\b(atom|red)\.global", lines["tma_add"]), lines["tma_add"]


@pytest.fixture
def tma_reductions_emulated(monkeypatch):
    """Triton's interpreter has no descriptor reduction: here it gets one (the TMA add's semantics, a
    read-add-write of the box's in-bounds elements, programs one after another), and the launcher is told
    it may use it, so dq_mode="tma_add" runs its DQ_ATOMIC=2 branch on the CPU. Returns the DQ_ATOMIC of
    every backward launch and the number of reductions run."""
    from kernels.methods.flash import bwd
    from kernels.methods.flash.tiles import interpreter_enabled
    from kernels.methods.triton import fastlaunch

    if not interpreter_enabled():
        pytest.skip("emulates the reduction in Triton's interpreter (on a GPU the GPU tests run the real one)")
    from triton.runtime import interpreter as interp

    seen = {"modes": [], "reductions": 0}

    def reduce(self, kind, desc, value, indices):
        seen["reductions"] += 1
        ptrs, mask = desc.materialize_pointers(indices)
        old = self.create_masked_load(ptrs, mask, None, None, False)
        new = interp.TensorHandle((old.data + value.data).astype(old.data.dtype), old.dtype)
        return self.create_masked_store(ptrs, new, mask, None)

    launch = fastlaunch.launch

    def record(kernel, grid, args, meta, device=None):
        if "DQ_ATOMIC" in meta:
            seen["modes"].append(meta["DQ_ATOMIC"])
        return launch(kernel, grid, args, meta, device)

    monkeypatch.setattr(interp.InterpreterBuilder, "create_descriptor_reduce", reduce, raising=False)
    monkeypatch.setattr(bwd, "interpreter_enabled", lambda: False)
    monkeypatch.setattr(fastlaunch, "launch", record)
    return seen


@pytest.mark.parametrize("case", [(2, 2, 41, 23, 24, torch.bfloat16, True, "off", 16),
                                  (2, 2, 41, 23, 24, torch.bfloat16, False, "off", 16),
                                  (1, 2, 37, 30, 16, torch.float16, True, "host", 32),
                                  (1, 2, 23, 41, 40, torch.float32, True, "off", 16)],
                         ids=["d24-causal", "d24-full", "fp16-host-tma", "fp32-d40-tq<tk"])
def test_tma_add_dq_against_float64(tma_reductions_emulated, case):
    """dq by TMA reductions (DQ_ATOMIC=2, emulated): a padded head dim, Tq > Tk (rows with no key) and
    Tq < Tk, partial query blocks whose rows past Tq the descriptor's bounds keep out, host TMA beside it."""
    B, H, tq, tk, d, dtype, causal, tma, bm1 = case
    b = dataclasses.replace(SMALL_BWD, dq_mode="tma_add", tma=tma, block_m1=bm1,
                            block_n1=32 if tma == "host" else SMALL_BWD.block_n1)
    f = dataclasses.replace(SMALL_FWD, tma=tma)
    run_and_compare(*make_qkv(B, H, tq, tk, d, dtype, layout="bthd"), causal=causal, plan=(f, b))
    assert tma_reductions_emulated["modes"] == [2] and tma_reductions_emulated["reductions"] > 0


@pytest.mark.parametrize("tma_there", [True, False])
def test_tma_add_launches_descriptor_reductions_where_tma_is(monkeypatch, tma_there):
    """dq_mode="tma_add" hands the dk/dv programs a (1, 1, BLOCK_M1, d_pad) descriptor of the fp32 dq
    buffer and DQ_ATOMIC=2 where TMA is (sm_90+, outside the interpreter), element atomics (1) elsewhere;
    no dq programs either way."""
    from kernels.methods.flash import bwd, fwd
    from kernels.methods.flash.tiles import TensorDescriptor

    b = dataclasses.replace(SMALL_BWD, dq_mode="tma_add", block_m1=32)
    monkeypatch.setattr(bwd, "interpreter_enabled", lambda: False)
    monkeypatch.setattr(fwd, "tma_supported", lambda device: tma_there)
    seen = _recorded_launches(monkeypatch, (SMALL_FWD, b), run=False)  # (no descriptor reductions here)
    kv = [(args, meta) for kernel, args, meta in seen if meta.get("DO_KV") is not None]
    assert len(kv) == 1 and kv[0][1]["DO_KV"] and not kv[0][1]["DO_Q"]
    args, meta = kv[0]
    dqa = args[13]  # Q, K, V, DO, Q2, K2, V2, DO2, DQ, DK, DV_, LSE, DELTA, DQA
    if tma_there:
        assert meta["DQ_ATOMIC"] == 2 and isinstance(dqa, TensorDescriptor)
        assert list(dqa.block_shape) == [1, 1, 32, 16] and dqa.base.dtype == torch.float32
        assert list(dqa.shape) == [1, 2, 40, 16]
    else:
        assert meta["DQ_ATOMIC"] == 1 and isinstance(dqa, torch.Tensor) and dqa.dtype == torch.float32


def test_sweep_checks_and_times_both_dq_modes(tmp_path):
    """The plan sweep in the interpreter at a tiny shape: every candidate checked against float64
    first, the atomic-dq phase timed, an invalid combination skipped, a table entry printed."""
    import json

    from kernels.methods.flash import sweep

    out = tmp_path / "sweep.json"
    sweep.main(["--shapes", "1,2,40,16", "--device", DEVICE, "--no-baselines", "--rep-ms", "1", "--out", str(out),
                "--fwd-phases", "block_m=16 block_n=16",
                "--bwd-phases", "block_m1=16 block_n1=16 block_m2=16 block_n2=16 pre_block=16 | fused=1 | "
                                "fused=0 dq_mode=atomic | fused=1 dq_mode=atomic"])
    recs = json.loads(out.read_text())
    bwd = [r for r in recs["results"] if r["direction"] == "fwd+bwd"]
    assert {r["plan"]["dq_mode"] for r in bwd} == {"pass", "atomic"}
    assert all(r["status"] == "ok" and r["error"] <= kernels.ATTN_BWD_TOL[torch.bfloat16] for r in bwd)
    assert not any(r["plan"]["fused"] and r["plan"]["dq_mode"] == "atomic" for r in bwd)  # invalid: skipped
    assert set(recs["best"]) == {"1,2,40,40,16/causal/bfloat16"}


def test_sweep_tries_the_program_order_only_where_causal(tmp_path):
    """FwdPlan.group changes only the causal launch: the sweep times its values there and leaves the
    phase out of the non-causal shape (the same launch four times otherwise)."""
    import json

    from kernels.methods.flash import sweep

    out = tmp_path / "sweep.json"
    sweep.main(["--shapes", "2,3,40,16", "--device", DEVICE, "--no-baselines", "--rep-ms", "1", "--out", str(out),
                "--causal", "both", "--mode", "fwd", "--fwd-phases", "block_m=16 block_n=16 | group=1,2,4"])
    recs = json.loads(out.read_text())["results"]
    groups = {causal: {r["plan"]["group"] for r in recs if r["shape"].split("/")[1] == causal} for causal in
              ("causal", "full")}
    assert groups == {"causal": {1, 2, 4}, "full": {1}}
    assert all(r["status"] == "ok" for r in recs)


def test_tma_falls_back_to_pointers_where_it_cannot_read():
    q, k, v = make_qkv(1, 1, 16, 16, 16, torch.float16)
    assert resolve_tma("host", q.device, q, k, v) == ("host" if tma_supported(q.device) else "off")
    odd = torch.randn(1, 1, 16, 17, dtype=torch.float16, device=DEVICE)[..., 1:]  # 2-byte offset, 34-byte rows
    assert resolve_tma("host", q.device, odd, k, v) == "off"
    assert resolve_tma("off", q.device, q, k, v) == "off"
    run_and_compare(odd.detach().requires_grad_(True), k, v, causal=True,
                    plan=(dataclasses.replace(SMALL_FWD, tma="host"), dataclasses.replace(SMALL_BWD, tma="host")))


def test_clear_errors(monkeypatch):
    q, k, v = make_qkv(1, 1, 8, 8, 16, torch.float16)
    with pytest.raises(ValueError, match="no dropout.*sdpa"):
        kernels.attention(q, k, v, dropout_p=0.1, method="flash")
    big = torch.randn(1, 1, 8, 160, dtype=torch.float16, device=DEVICE)
    with pytest.raises(ValueError, match="head dimensions up to 128"):
        kernels.attention(big, big, big, method="flash")
    with pytest.raises(TypeError, match="dtype"):  # float64 is outside the contract
        kernels.attention(q.double(), k.double(), v.double(), method="flash")
    if DEVICE == "cpu":  # outside the interpreter a CPU tensor is refused before any kernel
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        with pytest.raises(ValueError, match="CUDA tensors"):
            kernels.attention(q, k, v, method="flash")


def test_opcheck():
    q, k, v = (t.detach() for t in make_qkv(1, 2, 20, 20, 16, torch.float16))
    with plans.override(*SMALL):
        torch.library.opcheck(torch.ops.softmax_harness.flash_attention_fwd.default, (q, k, v, 0.25, True))
        out, lse = torch.ops.softmax_harness.flash_attention_fwd(q, k, v, 0.25, True)
        do = torch.randn_like(out)
        torch.library.opcheck(torch.ops.softmax_harness.flash_attention_bwd.default,
                              (do, q, k, v, out, lse, 0.25, True))


def test_fullgraph_compile_equals_eager():
    q, k, v = make_qkv(1, 2, 20, 20, 16, torch.bfloat16, layout="bthd")

    def f(q, k, v):
        return kernels.attention(q * 1.5, k, v, method="flash").float().square().sum()

    with plans.override(*SMALL):
        eager = f(q, k, v)
        grads = torch.autograd.grad(eager, (q, k, v))
        compiled = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v)
        cgrads = torch.autograd.grad(compiled, (q, k, v))
    assert torch.equal(eager, compiled)
    for g, c in zip(grads, cgrads):
        assert torch.equal(g, c)


def test_launch_plan_table_lookup(monkeypatch):
    f1, b1 = plans.FwdPlan(block_m=64, block_n=32), plans.BwdPlan(block_m1=64)
    f2, b2 = plans.FwdPlan(block_m=128, block_n=128, num_warps=8, tma="host"), plans.BwdPlan(fused=True)
    monkeypatch.setitem(plans.TABLE, (64, "bfloat16", True), ((1024, f1, b1), (8192, f2, b2)))
    plans.forget()
    try:
        assert plans.plans_for(64, 64, torch.bfloat16, True, 1024, 1024) == (f1, b1)
        assert plans.plans_for(48, 64, torch.bfloat16, True, 2048, 2048) == (f2, b2)  # d 48 pads to 64
        assert plans.plans_for(64, 64, torch.bfloat16, True, 20000, 20000) == (f2, b2)  # past the last: the last
        assert plans.plans_for(64, 64, torch.bfloat16, True, 1024, 1024) is plans.plans_for(64, 64, torch.bfloat16,
                                                                                          True, 1024, 1024)  # cached
        default = plans.plans_for(64, 64, torch.float16, True, 1024, 1024)  # no entry: the defaults
        assert default == plans.default_plans(64, torch.float16, True)
        tiny_f, tiny_b = plans.plans_for(64, 64, torch.bfloat16, True, 1, 20)  # clamped to the sequences
        assert (tiny_f.block_m, tiny_f.block_n, tiny_b.block_m2, tiny_b.block_n1) == (16, 32, 16, 32)
        with plans.override(SMALL_FWD):
            assert plans.plans_for(64, 64, torch.bfloat16, True, 1024, 1024)[0] == SMALL_FWD
        assert plans.plans_for(64, 64, torch.bfloat16, True, 1024, 1024) == (f1, b1)
    finally:
        plans.forget()
    with pytest.raises(ValueError, match="powers of two"):
        plans.FwdPlan(block_m=48)
    with pytest.raises(ValueError, match="group=0.*int >= 1"):
        plans.FwdPlan(group=0)
    with pytest.raises(ValueError, match="tma"):
        plans.BwdPlan(tma="yes")
    with pytest.raises(ValueError, match="dq_mode='sum'.*pass, atomic, tma_add"):
        plans.BwdPlan(dq_mode="sum")
    for mode in ("atomic", "tma_add"):
        with pytest.raises(ValueError, match=f"dq_mode='{mode}' has no dq programs"):
            plans.BwdPlan(dq_mode=mode, fused=True)


def test_method_is_registered_with_its_config():
    from pathlib import Path

    import yaml

    m = kernels.get_method("flash")
    assert m.ops() == {"attention": "native"}
    conf = yaml.safe_load((Path(__file__).parents[1] / "conf/accel/flash.yaml").read_text())
    assert conf == {"name": "flash", "method": "flash"}


# -- full sizes on a GPU ---------------------------------------------------------------------------
GPU_SHAPES = [(16, 12, 1024, 64), (4, 12, 4096, 64), (8, 16, 2048, 128)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_gpu_full_size_against_float64_on_two_heads(shape, causal):
    B, H, T, d = shape
    q, k, v = make_qkv(B, H, T, T, d, torch.bfloat16, layout="bthd", device="cuda")
    out = kernels.attention(q, k, v, causal=causal, method="flash")
    do = torch.randn_like(out)
    out.backward(do)
    sub = [t.detach()[:1, :2].double().requires_grad_(True) for t in (q, k, v)]
    ref = kernels.reference_attention(*sub, causal=causal)
    ref.backward(do[:1, :2].double())
    for got, want, tol in ((out, ref, kernels.ATTN_FWD_TOL), (q.grad, sub[0].grad, kernels.ATTN_BWD_TOL),
                           (k.grad, sub[1].grad, kernels.ATTN_BWD_TOL), (v.grad, sub[2].grad, kernels.ATTN_BWD_TOL)):
        assert torch.isfinite(got).all()
        assert kernels.relative_error(got[:1, :2], want) <= tol[torch.bfloat16]


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["off", "host", "device", "warp_specialize", "fused", "atomic", "atomic-d128",
                                     "atomic-host", "tma_add", "tma_add-d128", "tma_add-host"])
def test_gpu_hopper_switches_are_correct(variant):
    f, b = plans.default_plans(64, torch.bfloat16, True)
    if variant in plans.TMA_MODES:
        f, b = dataclasses.replace(f, tma=variant), dataclasses.replace(b, tma=variant)
    elif variant == "warp_specialize":  # Triton 3.6 cannot build it with 4 warps on Hopper
        f = dataclasses.replace(f, warp_specialize=True, num_warps=8)
        b = dataclasses.replace(b, warp_specialize=True, num_warps=8, dq_warps=8)
    elif variant.startswith(("atomic", "tma_add")):
        d = 128 if variant.endswith("d128") else 64
        f, b = plans.default_plans(d, torch.bfloat16, True)
        b = dataclasses.replace(b, dq_mode=variant.split("-")[0], tma="host" if variant.endswith("host") else b.tma)
        run_and_compare(*make_qkv(2, 4, 1000, 1000, d, torch.bfloat16, layout="bthd", device="cuda"),
                        causal=True, plan=(f, b))
        return
    else:
        b = dataclasses.replace(b, fused=True)
    run_and_compare(*make_qkv(2, 4, 1000, 1000, 64, torch.bfloat16, layout="bthd", device="cuda"),
                    causal=True, plan=(f, b))


def _recorded_launches(monkeypatch, plan, tma="off", run=True):
    """(kernel, args, meta) of every launch one forward + backward makes (launched the plain way, or
    not at all without ``run``)."""
    from kernels.methods.triton import fastlaunch

    seen = []

    def record(kernel, grid, args, meta, device=None):
        seen.append((kernel, args, meta))
        if run:
            kernel[grid](*args, **meta)

    monkeypatch.setattr(fastlaunch, "launch", record)
    f, b = (dataclasses.replace(p, tma=tma) for p in plan)
    q, k, v = make_qkv(1, 2, 40, 40, 16, torch.float16, layout="bthd")
    out, lse = launch_fwd(q, k, v, 0.25, True, f)
    from kernels.methods.flash.bwd import launch_bwd

    launch_bwd(torch.randn_like(out), q, k, v, out, lse, 0.25, True, b)
    return seen


@pytest.mark.parametrize("fused", [False, True])
def test_every_flash_launch_takes_the_direct_path_shape(monkeypatch, fused):
    """fastlaunch launches a kernel directly only when the positionals are its plain parameters and every
    later parameter is a constexpr given by keyword (else it silently takes Triton's launcher): each
    launch of a forward + backward (forward, delta, dk/dv, dq) passes its arguments that way."""
    import inspect

    seen = _recorded_launches(monkeypatch, (SMALL_FWD, dataclasses.replace(SMALL_BWD, fused=fused)))
    assert len(seen) == (3 if fused else 4)
    for kernel, args, meta in seen:
        fn = getattr(kernel, "fn", kernel)
        params = list(inspect.signature(fn).parameters.values())
        plain = [p.name for p in params[:len(args)] if p.annotation is not inspect.Parameter.empty]
        assert not plain, f"{fn.__name__}: positionals {plain} are annotated (constexprs?)"
        later = [p.name for p in params[len(args):]]
        assert all("constexpr" in str(p.annotation) for p in params[len(args):]), fn.__name__
        assert set(later) <= set(meta), f"{fn.__name__}: constexprs {set(later) - set(meta)} not given by keyword"
        if hasattr(kernel, "params"):  # a JITFunction (no interpreter): fastlaunch's own test of the signature
            from kernels.methods.triton import fastlaunch

            assert fastlaunch._layout(kernel, args, meta) is not None, fn.__name__
        else:  # the interpreter's stand-in: the decorator's arguments
            assert not kernel.kwargs.get("do_not_specialize"), fn.__name__


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [False, True])
def test_gpu_direct_launches_match_plain_ones(fused):
    """Forward and backward launched directly (after the first, compiling call) give bit for bit what
    Triton's launcher gives, and direct entries were made for the flash kernels."""
    from kernels.methods.flash.bwd import launch_bwd
    from kernels.methods.triton import fastlaunch as fl

    if fl.unsupported_reason() is not None:
        pytest.skip(f"no direct launches with this Triton: {fl.unsupported_reason()}")
    f, b = plans.default_plans(64, torch.bfloat16, True)
    b = dataclasses.replace(b, fused=fused)
    q, k, v = make_qkv(2, 4, 1000, 1000, 64, torch.bfloat16, layout="bthd", device="cuda")
    do = torch.randn(2, 4, 1000, 64, device="cuda", dtype=torch.bfloat16)
    results = {}
    try:
        for direct in (False, True):
            fl.configure(direct)
            fl.clear()
            for _ in range(3):  # the first call compiles (or finds) and records; the next ones go direct
                out, lse = launch_fwd(q, k, v, 0.125, True, f)
                grads = launch_bwd(do, q, k, v, out, lse, 0.125, True, b)
            results[direct] = (out, lse, *grads)
            if direct:
                made = {getattr(e[0], "__name__", "") or e[0].fn.__name__ for e in fl._kernels.values() if e[1]}
                assert {"_fwd_kernel", "_delta_kernel", "_bwd_kernel"} <= made, made
    finally:
        fl.configure()
    assert all(torch.equal(a, c) for a, c in zip(results[False], results[True]))


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["atomic", "tma_add"])
@pytest.mark.parametrize("tq,tk,causal", [(1000, 1000, False), (700, 1300, True), (1300, 700, True)])
def test_gpu_atomic_dq_full_and_ragged(tq, tk, causal, mode):
    """dq by concurrent atomic adds or TMA reductions (the interpreter runs programs one by one, and has
    no descriptor reductions): not causal, Tq < Tk, and Tq > Tk (queries with no key)."""
    f, b = plans.default_plans(64, torch.bfloat16, causal)
    run_and_compare(*make_qkv(2, 4, tq, tk, 64, torch.bfloat16, layout="bthd", device="cuda"), causal=causal,
                    plan=(f, dataclasses.replace(b, dq_mode=mode)))


@pytest.mark.gpu
def test_gpu_opcheck_and_compile():
    q, k, v = (t.detach() for t in make_qkv(2, 4, 256, 256, 64, torch.bfloat16, layout="bthd", device="cuda"))
    torch.library.opcheck(torch.ops.softmax_harness.flash_attention_fwd.default, (q, k, v, 0.125, True))
    out, lse = torch.ops.softmax_harness.flash_attention_fwd(q, k, v, 0.125, True)
    torch.library.opcheck(torch.ops.softmax_harness.flash_attention_bwd.default,
                          (torch.randn_like(out), q, k, v, out, lse, 0.125, True))
    f = lambda q, k, v: kernels.attention(q, k, v, method="flash")  # noqa: E731
    assert torch.equal(torch.compile(f, fullgraph=True)(q, k, v), f(q, k, v))


@pytest.mark.gpu
def test_gpu_gpt_training_step_matches_torch():
    from harness.accel import apply_accel
    from models import GPT, GPTConfig

    def step(method):
        torch.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=512, context=256, n_layer=2, n_head=4, n_embd=256)).cuda()
        apply_accel(model, method, patch=["attention"])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        idx = torch.randint(0, 512, (4, 256), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
        losses = []
        for _ in range(3):
            with torch.autocast("cuda", torch.bfloat16):
                _, loss = model(idx, idx.roll(-1, dims=1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
        return losses

    ref, got = step("torch"), step("flash")
    for a, b in zip(ref, got):
        assert abs(a - b) <= 2e-2 * abs(a), (ref, got)
