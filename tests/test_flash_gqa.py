"""The flash method with grouped-query attention (k and v with Hkv heads, H % Hkv == 0; query head h reads
kv head h // (H / Hkv)): forward and backward against a float64 reference that expands k and v, the plan
variants (fused, delta_in_dq, atomic dq, deterministic), the fused projection, and the refusals.

Called through flash's own op function (``ops.flash_attention``) and launchers, in Triton's interpreter with
16-wide blocks on the CPU; the GPU-marked test compares with SDPA's ``enable_gqa`` at real sizes.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import kernels
from kernels.methods.flash import plan as plans
from kernels.methods.flash.bwd import launch_bwd
from kernels.methods.flash.ops import flash_attention
from kernels.methods.flash.qkv import flash_attention_qkv
from tests.mismatch import where

pytestmark = pytest.mark.skipif("flash" not in kernels.runnable_methods(op="attention"),
                                reason="flash cannot run here")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SMALL_FWD = plans.FwdPlan(block_m=16, block_n=16)
SMALL_BWD = plans.BwdPlan(block_m1=16, block_n1=16, block_m2=16, block_n2=16, pre_block=16)


def make(B, H, HKV, tq, tk, d, dtype, layout="bhtd", seed=0, device=DEVICE):
    """q (B, H, Tq, d), k and v (B, Hkv, Tk, d); 'bthd': transposed views of (B, T, H, d) tensors."""
    g = torch.Generator().manual_seed(seed)

    def rand(b, h, t):
        shape = (b, t, h, d) if layout == "bthd" else (b, h, t, d)
        x = torch.randn(*shape, generator=g).to(device=device, dtype=dtype)
        return (x.transpose(1, 2) if layout == "bthd" else x).requires_grad_(True)

    return rand(B, H, tq), rand(B, HKV, tk), rand(B, HKV, tk)


def reference(q, k, v, do, causal):
    """float64 out, dq, dk, dv with k and v expanded over the group (their gradients summed back)."""
    group = q.shape[1] // k.shape[1]
    ins = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    ref = kernels.reference_attention(ins[0], ins[1].repeat_interleave(group, 1),
                                      ins[2].repeat_interleave(group, 1), causal=causal)
    ref.backward(do.double())
    return [ref.detach()] + [t.grad for t in ins]


def check(got, want, dtype):
    for name, g, w, base in zip(("out", "dq", "dk", "dv"), got, want,
                                (kernels.ATTN_FWD_TOL, *[kernels.ATTN_BWD_TOL] * 3)):
        assert g.shape == w.shape and g.dtype == dtype, name
        assert torch.isfinite(g).all(), f"{name} has NaN or inf"
        tol = max(base[dtype], 3 * kernels.rounding_floor(w, dtype))
        err = kernels.relative_error(g, w)
        assert err <= tol, f"{name}: relative error {err:.2e} > {tol:.2e}; " + where(g, w, tol * w.abs().max().item(), tol)


def run(q, k, v, causal, fwd=SMALL_FWD, bwd=SMALL_BWD):
    with plans.override(fwd, bwd):
        out = flash_attention(q, k, v, q.shape[-1] ** -0.5, causal, 0.0)
        do = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device, out.dtype)
        out.backward(do)
    check([out, q.grad, k.grad, v.grad], reference(q, k, v, do, causal), q.dtype)


@pytest.mark.parametrize("HKV", [1, 2, 4])
@pytest.mark.parametrize("causal", [True, False])
def test_forward_backward_against_expanded_float64(HKV, causal):
    run(*make(1, 4, HKV, 17 if causal else 33, 33, 16, torch.bfloat16), causal)


@pytest.mark.parametrize("tq,tk,causal", [(17, 33, True), (33, 17, True), (17, 33, False)])
def test_tq_differs_from_tk(tq, tk, causal):
    run(*make(1, 4, 2, tq, tk, 32, torch.float32), causal)


def test_strided_bthd_views():
    q, k, v = make(2, 4, 1, 17, 17, 16, torch.bfloat16, layout="bthd")
    assert not q.is_contiguous() and k.stride(1) == 16
    run(q, k, v, True)


@pytest.mark.parametrize("variant", [dict(delta_in_dq=True), dict(dq_mode="atomic"), dict(one_loop=True)])
def test_backward_plan_variants(variant):
    run(*make(1, 4, 2, 33, 33, 16, torch.float32), True, bwd=dataclasses.replace(SMALL_BWD, **variant))


def test_table_fused_plan_runs_unfused():
    """A table plan with ``fused`` runs the two passes for Hkv < H."""
    run(*make(1, 4, 2, 33, 33, 16, torch.float32), True, bwd=dataclasses.replace(SMALL_BWD, fused=True))


def test_deterministic_path():
    """Under deterministic algorithms an atomic plan runs the dq pass."""
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        run(*make(1, 4, 2, 17, 33, 16, torch.float32, seed=3), True, bwd=dataclasses.replace(SMALL_BWD, dq_mode="atomic"))
    finally:
        torch.use_deterministic_algorithms(previous)


def test_explicit_fused_plan_refuses_groups_with_the_reason():
    q, k, v = make(1, 4, 2, 17, 17, 16, torch.float32)
    out = torch.zeros_like(q)
    lse = torch.zeros(q.shape[:3], dtype=torch.float32, device=q.device)
    with pytest.raises(ValueError, match="fused backward takes k and v with q's number of heads"):
        launch_bwd(out, q, k, v, out, lse, 0.25, True, plan=dataclasses.replace(SMALL_BWD, fused=True))


def test_heads_not_a_multiple_are_refused():
    q, k, v = make(1, 4, 3, 17, 17, 16, torch.float32)
    with pytest.raises(ValueError, match="4 query heads and 3 kv heads"):
        flash_attention(q, k, v, 0.25, True, 0.0)


def test_fused_projection_with_kv_heads():
    """attention_qkv on (B, T, (H + 2 Hkv) d): the three gradients land in qkv's one gradient."""
    B, T, H, HKV, d = 1, 33, 4, 2, 16
    qkv = torch.randn(B, T, (H + 2 * HKV) * d, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    qkv.requires_grad_(True)
    with plans.override(SMALL_FWD, SMALL_BWD):
        out = flash_attention_qkv(qkv, H, d ** -0.5, True, 0.0, n_kv_head=HKV)
        do = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device)
        out.backward(do)
    views = [t.detach().view(B, T, -1, d).transpose(1, 2).requires_grad_(True)
             for t in qkv.split([H * d, HKV * d, HKV * d], dim=2)]
    want = reference(*views, do, True)
    dq, dk, dv = (t.view(B, T, -1, d).transpose(1, 2) for t in qkv.grad.split([H * d, HKV * d, HKV * d], dim=2))
    check([out, dq, dk, dv], want, torch.float32)


def test_torch_ops_opcheck_with_kv_heads():
    """The custom ops (the route torch.compile traces) with Hkv < H: fake shapes and strides match the kernels'."""
    q, k, v = (t.detach() for t in make(1, 4, 2, 17, 17, 16, torch.float32))
    ops = torch.ops.softmax_harness
    with plans.override(SMALL_FWD, SMALL_BWD):
        torch.library.opcheck(ops.flash_attention_fwd.default, (q, k, v, 0.25, True), test_utils=("test_faketensor",))
        out, lse = ops.flash_attention_fwd(q, k, v, 0.25, True)
        torch.library.opcheck(ops.flash_attention_bwd.default, (torch.randn_like(out), q, k, v, out, lse, 0.25, True),
                              test_utils=("test_faketensor",))
        qkv = torch.randn(1, 17, 8 * 16)
        torch.library.opcheck(ops.flash_attention_qkv_fwd.default, (qkv, 4, 0.25, True, 2),
                              test_utils=("test_faketensor",))


@pytest.mark.gpu
@pytest.mark.parametrize("HKV", [2, 4, 12])
@pytest.mark.parametrize("d", [64, 128])
def test_real_sizes_against_sdpa_enable_gqa(HKV, d):
    B, H, T = 4, 12, 1024
    q, k, v = make(B, H, HKV, T, T, d, torch.bfloat16, device="cuda")
    out = flash_attention(q, k, v, d ** -0.5, True, 0.0)
    do = torch.randn_like(out)
    out.backward(do)
    got = [out, q.grad, k.grad, v.grad]
    ins = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    ref = torch.nn.functional.scaled_dot_product_attention(*ins, is_causal=True, enable_gqa=True)
    ref.backward(do)
    want = [ref] + [t.grad for t in ins]
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        err = kernels.relative_error(g, w)
        assert err <= 2e-2, f"{name}: relative error {err:.2e} against SDPA"


@pytest.fixture
def grouped_gluon(monkeypatch):
    """The Gluon kernels' grouped path on (``gluon_common.GROUPED``; off until these tests have passed on a GPU),
    with no plan or prepared launch kept from before."""
    from kernels.methods.flash import gluon_common

    monkeypatch.setattr(gluon_common, "GROUPED", True)
    plans.forget()
    yield
    plans.forget()


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2, 14, 2, 2048, 2048, 64), (2, 9, 3, 1999, 1999, 64), (1, 8, 2, 1000, 2048, 128),
                                   (2, 12, 4, 2048, 2048, 128), (1, 12, 1, 1536, 1536, 64)])
@pytest.mark.parametrize("layout", ["bthd", "bhtd"])
@pytest.mark.parametrize("deterministic", [False, True])
def test_gluon_kernels_take_grouped_heads_on_the_gpu(shape, layout, deterministic, grouped_gluon):
    """The table's Gluon plans run grouped heads (Qwen2.5's 7 query heads a kv head, SmolLM2's 3, one kv head,
    ragged T, Tq < Tk, d = 64 and 128, the model's layout and a contiguous one): the forward, the dk/dv pass
    summing a group's query heads (adding dq by TMA, or under deterministic algorithms the dq pass) and the Gluon
    dq pass, against float64 with k and v expanded. Explicit plans refuse rather than fall back, so the Gluon
    kernels are what ran."""
    from kernels.methods.flash.fwd import launch_fwd

    B, H, HKV, tq, tk, d = shape
    q, k, v = (t.detach() for t in make(B, H, HKV, tq, tk, d, torch.bfloat16, layout=layout, device="cuda"))
    fplan, bplan = plans.plans_for(d, d, torch.bfloat16, True, tq, tk)
    assert fplan.gluon and bplan.gluon, (fplan, bplan)
    do = torch.randn(B, H, tq, d, generator=torch.Generator().manual_seed(1)).to("cuda", torch.bfloat16)
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        out, lse = launch_fwd(q, k, v, d ** -0.5, True, fplan)
        dq, dk, dv = launch_bwd(do, q, k, v, out, lse, d ** -0.5, True, bplan)
    finally:
        torch.use_deterministic_algorithms(was)
    check([out, dq, dk, dv], reference(q, k, v, do, True), torch.bfloat16)


@pytest.mark.gpu
def test_grouped_heads_through_the_default_path_and_its_prepared_launches(grouped_gluon):
    """flash_attention at Qwen2.5's grouped shape (T = 2048: the table's Gluon plans) matches SDPA's enable_gqa, and
    its later calls (prepared launches, descriptors rebuilt for the new k and v heads) give the first call's
    results (dq to within the rounding of its TMA adds' varying order)."""
    B, H, HKV, T, d = 2, 14, 2, 2048, 64
    runs = []
    for i in range(3):
        q, k, v = make(B, H, HKV, T, T, d, torch.bfloat16, layout="bthd", device="cuda")
        out = flash_attention(q, k, v, d ** -0.5, True, 0.0)
        do = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to("cuda", torch.bfloat16)
        out.backward(do)
        runs.append([out.detach(), q.grad, k.grad, v.grad])
    ins = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    ref = torch.nn.functional.scaled_dot_product_attention(*ins, is_causal=True, enable_gqa=True)
    ref.backward(do)
    for name, g, w in zip(("out", "dq", "dk", "dv"), runs[0], [ref] + [t.grad for t in ins]):
        err = kernels.relative_error(g, w)
        assert err <= 2e-2, f"{name}: relative error {err:.2e} against SDPA"
    for got in runs[1:]:
        for name, a, b in zip(("out", "dq", "dk", "dv"), got, runs[0]):
            if name == "dq":
                assert (a.float() - b.float()).abs().max() <= 1e-2 * b.float().abs().max(), name
            else:
                assert torch.equal(a, b), name
