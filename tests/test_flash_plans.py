"""The flash method's launch plans (kernels/methods/flash/plan.py) and launch path: every plan switch
against float64 (TMA modes, the fused backward, dq by atomic adds or by TMA reductions, the causal
program order), what the dq modes compile to for sm_90, the plan table and its lookup, and
the direct launches (kernels.runtime.fastlaunch). The helpers and the CPU/GPU split are
tests/test_flash_attention.py's.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import kernels
from kernels.methods.flash import plan as plans
from kernels.methods.flash.bwd import launch_bwd
from kernels.methods.flash.fwd import launch_fwd, resolve_tma
from kernels.methods.flash.tiles import tma_supported
from tests.test_flash_attention import DEVICE, SMALL, SMALL_BWD, SMALL_FWD, make_qkv, run_and_compare

pytestmark = pytest.mark.skipif("flash" not in kernels.runnable_methods(op="attention"),
                                reason="flash cannot run here")


@pytest.mark.parametrize("variant", ["tma-host", "tma-device", "fused", "fused-tma-host", "mixed-blocks", "atomic-dq",
                                     "atomic-dq-tma-host", "tma_add-dq", "delta-in-dq", "delta-in-dq-tma-host"])
def test_plan_variants(variant):
    f, b = SMALL
    if variant.startswith("delta-in-dq"):  # delta formed by the dq pass (o read by pointers beside TMA tiles)
        tma = "host" if variant.endswith("host") else "off"
        f, b = dataclasses.replace(f, tma=tma), dataclasses.replace(b, delta_in_dq=True, tma=tma)
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


@pytest.mark.parametrize("group", [2, pytest.param(4, marks=pytest.mark.slow), 8])  # (4: between the two)
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


@pytest.mark.slow  # compiles every dq mode for sm_90 (~7 s)
def test_dq_adds_compile_to_what_each_mode_promises():
    """Compiled for sm_90 (no GPU: harness.bench flash-compile-check in a subprocess without the
    interpreter, HARNESS_COMPILE_PYTHON's Triton where set): the atomic mode's dk/dv kernel adds dq by
    vector fp32 atomics, tma_add's by bulk tensor reductions and no element atomic."""
    import re

    from tests.compiled_report import compile_run

    lines = {}
    for mode in ("atomic", "tma_add"):
        run = compile_run(["-m", "harness.bench", "flash-compile-check", "--d", "64", "--bwd",  # the Triton dk/dv kernel
                           f"gluon=0 block_m1=32 block_n1=64 dq_mode={mode} overlap=0 lpt_mb=0"], 600)
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
    from kernels.runtime import fastlaunch

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


def test_tma_falls_back_to_pointers_where_it_cannot_read():
    q, k, v = make_qkv(1, 1, 16, 16, 16, torch.float16)
    assert resolve_tma("host", q.device, q, k, v) == ("host" if tma_supported(q.device) else "off")
    odd = torch.randn(1, 1, 16, 17, dtype=torch.float16, device=DEVICE)[..., 1:]  # 2-byte offset, 34-byte rows
    assert resolve_tma("host", q.device, odd, k, v) == "off"
    assert resolve_tma("off", q.device, q, k, v) == "off"
    run_and_compare(odd.detach().requires_grad_(True), k, v, causal=True,
                    plan=(dataclasses.replace(SMALL_FWD, tma="host"), dataclasses.replace(SMALL_BWD, tma="host")))


def test_launch_plans_for_grouped_heads_are_the_triton_kernels_until_the_gluon_ones_take_them(monkeypatch):
    """What the tuning tools start from: the table's plans without groups; with them the Triton kernels' plans
    while the Gluon kernels' grouped path is off (``gluon_common.GROUPED``), the table's once it is on; a fused
    Triton backward becomes two passes for grouped heads (one grid cannot span the kv and the query heads)."""
    from kernels.methods.flash import gluon_common

    gf = plans.FwdPlan(block_m=128, block_n=128, num_stages=2, gluon=1)
    gb = plans.BwdPlan(block_m1=64, block_n1=128, block_n2=64, num_stages=2, gluon=2)
    tf, tb = plans.FwdPlan(block_m=64, block_n=32), plans.BwdPlan(block_m1=64, block_n1=32, fused=True)
    monkeypatch.setitem(plans.TABLE, (64, "bfloat16", True), ((1024, tf, tb), (1 << 30, gf, gb)))
    monkeypatch.setitem(plans.TRITON_TABLE, (64, "bfloat16", True), ((1 << 30, tf, tb),))
    plans.forget()
    unfused = dataclasses.replace(tb, fused=False)
    try:
        for grouped_gluon in (False, True):
            monkeypatch.setattr(gluon_common, "GROUPED", grouped_gluon)
            assert plans.launch_plans(64, 64, torch.bfloat16, True, 2048, 2048) == (gf, gb)
            assert plans.launch_plans(64, 64, torch.bfloat16, True, 2048, 2048, grouped=True) == (
                (gf, gb) if grouped_gluon else (tf, unfused))
            assert plans.launch_plans(64, 64, torch.bfloat16, True, 1024, 1024) == (tf, tb)
            assert plans.launch_plans(64, 64, torch.bfloat16, True, 1024, 1024, grouped=True) == (tf, unfused)
    finally:
        plans.forget()


def test_a_gluon_table_plan_falls_back_to_the_measured_triton_plans(monkeypatch):
    """Where a Gluon entry of the table cannot run (e.g. d = 96, padded to 128, which the Gluon kernels do not
    take), each direction gets the Triton kernels' measured plan: the table's own where it is a Triton one,
    else TRITON_TABLE's, else the defaults; clamped to the sequences like any plan."""
    tf, tb = plans.FwdPlan(block_m=64, block_n=32), plans.BwdPlan(block_m1=64, block_n1=32)
    gf = plans.FwdPlan(block_m=128, block_n=128, num_stages=2, gluon=1)
    gb = plans.BwdPlan(block_m1=64, block_n1=128, block_n2=64, num_stages=2, gluon=2)
    monkeypatch.setitem(plans.TABLE, (128, "bfloat16", True), ((1 << 30, gf, gb),))
    monkeypatch.setitem(plans.TABLE, (64, "bfloat16", True), ((1 << 30, tf, gb),))
    monkeypatch.setitem(plans.TRITON_TABLE, (128, "bfloat16", True), ((1 << 30, tf, tb),))
    monkeypatch.delitem(plans.TRITON_TABLE, (64, "bfloat16", True), raising=False)
    plans.forget()
    try:
        assert plans.plans_for(96, 96, torch.bfloat16, True, 2048, 2048) == (gf, gb)
        assert plans.triton_plans(96, 96, torch.bfloat16, True, 2048, 2048) == (tf, tb)
        # the table's forward is a Triton one: kept; its backward has no measured Triton plan: the default
        f, b = plans.triton_plans(64, 64, torch.bfloat16, True, 2048, 2048)
        assert f == tf and b == plans.default_plans(64, torch.bfloat16, True)[1]
        f, b = plans.triton_plans(96, 96, torch.bfloat16, True, 20, 20)
        assert (f.block_m, f.block_n, b.block_m1, b.block_n1) == (32, 32, 32, 32)
    finally:
        plans.forget()
    for key, rows in plans.TRITON_TABLE.items():  # the real fallbacks: Triton plans, for keys whose entry is Gluon
        assert all(not f.gluon and not b.gluon for _, f, b in rows), key
        assert any(f.gluon or b.gluon for _, f, b in plans.TABLE[key]), key


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


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["off", "host", "device", "warp_specialize", "fused", "atomic", "atomic-d128",
                                     "atomic-host", "tma_add", "tma_add-d128", "tma_add-host", "maxnreg"])
def test_gpu_hopper_switches_are_correct(variant):
    f, b = plans.default_plans(64, torch.bfloat16, True)
    if variant in plans.TMA_MODES:
        f, b = dataclasses.replace(f, tma=variant), dataclasses.replace(b, tma=variant)
    elif variant == "warp_specialize":  # Triton 3.6 cannot build it with 4 warps on Hopper
        f = dataclasses.replace(f, warp_specialize=True, num_warps=8)
        b = dataclasses.replace(b, warp_specialize=True, num_warps=8, dq_warps=8)
    elif variant == "maxnreg":  # registers capped below what the compiler takes (128 there): spills, same result
        f = dataclasses.replace(f, block_m=64, block_n=64, num_stages=2, maxnreg=80)
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
    from kernels.runtime import fastlaunch

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
    assert not any(meta.get("DELTA_IN_DQ") for _, _, meta in seen)
    for kernel, args, meta in seen:
        fn = getattr(kernel, "fn", kernel)
        params = list(inspect.signature(fn).parameters.values())
        plain = [p.name for p in params[:len(args)] if p.annotation is not inspect.Parameter.empty]
        assert not plain, f"{fn.__name__}: positionals {plain} are annotated (constexprs?)"
        later = [p.name for p in params[len(args):]]
        assert all("constexpr" in str(p.annotation) for p in params[len(args):]), fn.__name__
        assert set(later) <= set(meta), f"{fn.__name__}: constexprs {set(later) - set(meta)} not given by keyword"
        if hasattr(kernel, "params"):  # a JITFunction (no interpreter): fastlaunch's own test of the signature
            from kernels.runtime import fastlaunch

            assert fastlaunch._layout(kernel, args, meta) is not None, fn.__name__
        else:  # the interpreter's stand-in: the decorator's arguments
            assert not kernel.kwargs.get("do_not_specialize"), fn.__name__


def test_delta_in_the_dq_pass_runs_dq_first_and_no_delta_kernel(monkeypatch):
    """BwdPlan.delta_in_dq: forward, then the dq programs (forming delta), then the dk/dv programs reading
    it: three launches, no delta kernel; and the same dq, dk, dv as the plan with the delta kernel."""
    plan = (SMALL_FWD, dataclasses.replace(SMALL_BWD, delta_in_dq=True))
    seen = _recorded_launches(monkeypatch, plan)
    names = [getattr(k, "fn", k).__name__ for k, _, _ in seen]
    assert names == ["_fwd_kernel", "_bwd_kernel", "_bwd_kernel"]
    assert [(m["DO_KV"], m["DO_Q"], m["DELTA_IN_DQ"]) for _, _, m in seen[1:]] == [(False, True, True),
                                                                                  (True, False, False)]
    q, k, v = make_qkv(1, 2, 37, 37, 16, torch.float16, layout="bthd")
    out, lse = launch_fwd(q, k, v, 0.25, True, SMALL_FWD)
    do = torch.randn_like(out)
    got = launch_bwd(do, q, k, v, out, lse, 0.25, True, plan[1])
    want = launch_bwd(do, q, k, v, out, lse, 0.25, True, SMALL_BWD)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=2e-3, rtol=2e-3)  # (delta summed in another order)


def test_the_forward_register_cap_reaches_the_launch_and_keeps_the_result(monkeypatch):
    """FwdPlan.maxnreg: the Triton forward launched with ``maxnreg`` (ptxas's cap; none for 0), the same output
    as without it; refused for the Gluon kernel (it sets its own registers) and outside 24..255."""
    capped = dataclasses.replace(SMALL_FWD, maxnreg=96)
    seen = _recorded_launches(monkeypatch, (capped, SMALL_BWD))
    assert seen[0][2]["maxnreg"] == 96 and all("maxnreg" not in m for _, _, m in seen[1:])
    q, k, v = make_qkv(1, 2, 37, 37, 16, torch.float16, layout="bthd")
    for got, want in zip(launch_fwd(q, k, v, 0.25, True, capped), launch_fwd(q, k, v, 0.25, True, SMALL_FWD)):
        torch.testing.assert_close(got, want, atol=0, rtol=0)
    assert "maxnreg" not in _recorded_launches(monkeypatch, (SMALL_FWD, SMALL_BWD), run=False)[0][2]
    for bad in (dict(maxnreg=16), dict(maxnreg=256), dict(maxnreg=96.0),
                dict(maxnreg=96, gluon=1, block_m=128, block_n=64, num_stages=2)):
        with pytest.raises(ValueError, match="maxnreg"):
            plans.FwdPlan(**bad)


def test_delta_in_dq_plan_limits():
    for bad in (dict(fused=True), dict(dq_mode="atomic"), dict(dq_mode="tma_add")):
        with pytest.raises(ValueError, match="delta_in_dq=True"):
            plans.BwdPlan(delta_in_dq=True, **bad)
    assert plans.BwdPlan(delta_in_dq=True, gluon=1, block_n1=128, num_stages=2).delta_in_dq  # the Triton dq pass
    assert plans.BwdPlan(delta_in_dq=True, gluon=2, block_n1=128, block_m1=32, block_m2=128, block_n2=64,
                         num_stages=2, dq_stages=2).delta_in_dq  # the Gluon dq pass


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [False, True, "delta_in_dq"])
def test_gpu_direct_launches_match_plain_ones(fused):
    """Forward and backward launched directly (after the first, compiling call) give bit for bit what
    Triton's launcher gives, and direct entries were made for the flash kernels."""
    from kernels.methods.flash.bwd import launch_bwd
    from kernels.runtime import fastlaunch as fl

    if fl.unsupported_reason() is not None:
        pytest.skip(f"no direct launches with this Triton: {fl.unsupported_reason()}")
    f, b = plans.default_plans(64, torch.bfloat16, True)
    b = dataclasses.replace(b, delta_in_dq=True) if fused == "delta_in_dq" else dataclasses.replace(b, fused=fused)
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
                assert {"_fwd_kernel", "_bwd_kernel"} | ({"_delta_kernel"} if fused != "delta_in_dq" else set()) <= made, made
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


@pytest.mark.parametrize("mode", ["atomic", "tma_add"])
def test_atomic_dq_ignores_keys_past_tk_when_every_score_is_very_negative(mode):
    """Keys past Tk read as zeros: their score is 0 and exp(0 - lse) overflows where every real score of a
    row is below about -88 (lse is then that low). Their ds must not reach dq (inf x 0 = NaN): 23 keys in
    blocks of 16, not causal, scores of -550 to -860. The dq pass masks them: the adding modes' gradients
    match its (a float64 reference is no judge here: scores this large amplify the inputs' rounding)."""
    q, k, v = (t.detach() for t in make_qkv(1, 2, 19, 23, 16, torch.bfloat16, device=DEVICE))
    q, k = (q.abs() + 1).mul_(8), (k.abs() + 1).mul_(-8)
    out, lse = launch_fwd(q, k, v, 0.25, False, SMALL_FWD)
    assert lse.max() < -500
    do = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device, out.dtype)
    want = launch_bwd(do, q, k, v, out, lse, 0.25, False, SMALL_BWD)
    got = launch_bwd(do, q, k, v, out, lse, 0.25, False, dataclasses.replace(SMALL_BWD, dq_mode=mode))
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert torch.isfinite(g).all(), name
        torch.testing.assert_close(g, w, atol=2e-2 * w.abs().max().item(), rtol=2e-2, msg=name)
