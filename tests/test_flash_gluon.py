"""flash's Gluon forward (kernels/methods/flash/fwd_gluon.py, plan ``FwdPlan.gluon``): its plan's
limits, where it stands aside (an explicit plan refuses with the reason; a table plan falls back to the
Triton kernel), its compile for sm_90 without a GPU (warp-specialized, TMA loads, wgmma, no spill), and
on a Hopper GPU its output, log-sum-exp and the gradients through it against float64.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import kernels
from kernels.methods.flash import fwd_gluon
from kernels.methods.flash import plan as plans
from kernels.methods.flash.fwd import launch_fwd
from tests.test_flash_attention import make_qkv, run_and_compare

pytestmark = pytest.mark.skipif("flash" not in kernels.runnable_methods(op="attention"),
                                reason="flash cannot run here")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GLUON = plans.FwdPlan(block_m=128, block_n=128, num_stages=2, gluon=True)


def test_gluon_plan_limits():
    assert plans.FwdPlan(block_m=128, block_n=64, num_stages=3, gluon=True).gluon
    for bad in (dict(block_m=64), dict(block_n=32), dict(block_n=256), dict(num_stages=1)):
        with pytest.raises(ValueError, match="gluon=True"):
            dataclasses.replace(GLUON, **bad)
    # the Triton kernel's blocks shrink to short sequences; the Gluon kernel's tiles stay
    f, _ = plans.clamp(GLUON, plans.BwdPlan(), 5, 7)
    assert (f.block_m, f.block_n) == (128, 128)


def test_where_it_cannot_run_an_explicit_plan_refuses_and_a_table_plan_falls_back(monkeypatch):
    if DEVICE == "cuda" and fwd_gluon.supported(*make_qkv(1, 1, 8, 8, 64, torch.bfloat16)) is None:
        pytest.skip("the Gluon forward runs here")
    q, k, v = (t.detach() for t in make_qkv(1, 2, 37, 37, 64, torch.bfloat16))
    why = fwd_gluon.supported(q, k, v)
    assert why
    with pytest.raises(ValueError, match="cannot run here"):
        launch_fwd(q, k, v, 0.125, True, GLUON)
    key = (64, "bfloat16", True)
    monkeypatch.setitem(plans.TABLE, key, ((1 << 30, GLUON, plans.BwdPlan()),))
    plans.forget()
    try:
        assert plans.plans_for(64, 64, torch.bfloat16, True, 37, 37)[0].gluon
        out = kernels.attention(q, k, v, causal=True, method="flash")  # (the table's plan: no override)
        ref = kernels.reference_attention(q.double(), k.double(), v.double(), causal=True)
        assert kernels.relative_error(out, ref) <= kernels.ATTN_FWD_TOL[torch.bfloat16]
    finally:
        monkeypatch.undo()
        plans.forget()


def test_reasons_name_what_is_not_taken():
    if fwd_gluon.GLUON_ERROR:
        pytest.skip(fwd_gluon.GLUON_ERROR)
    q, k, v = (t.detach() for t in make_qkv(1, 1, 8, 8, 64, torch.bfloat16))
    assert "GPU" in fwd_gluon.supported(q, k, v) or DEVICE == "cuda"


_COMPILE = r"""
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from tests.compiled_report import report
from kernels.methods.flash import fwd_gluon as G

D, BN, STAGES, causal = (int(a) for a in sys.argv[1:5])
half = 64
lay = lambda rows: gl.NVMMASharedLayout.get_default_for([1, 1, rows, D], gl.bfloat16)  # noqa: E731
desc = lambda rows: f"tensordesc<bf16[1,1,{rows},{D}],{lay(rows)}>"  # noqa: E731
const = {"sod": 1, "BLOCK_M": half, "BLOCK_N": BN, "D": D, "STAGES": STAGES, "CAUSAL": bool(causal)}
sig = {"desc_q": desc(half), "desc_k": desc(BN), "desc_v": desc(BN), "O": "*bf16", "LSE": "*fp32", "sob": "i32",
       "soh": "i32", "som": "i32", "H": "i32", "TQ": "i32", "TK": "i32", "qk_scale": "fp32",
       **{k: "constexpr" for k in const}}
src = GluonASTSource(fn=G._fwd_ws_kernel, signature=sig, constexprs=const,
                     attrs={(3,): [["tt.divisibility", 16]], (4,): [["tt.divisibility", 16]]})
k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
print(json.dumps(report(k)))
"""


@pytest.mark.parametrize("d,block_n,stages,causal", [(64, 128, 3, 1), (128, 128, 2, 0)])
def test_gluon_forward_compiles_for_sm90_warp_specialized(d, block_n, stages, causal):
    """Compiled for Hopper without a GPU (in a subprocess without TRITON_INTERPRET): TMA loads of 4-D
    boxes, wgmma, the producer's and consumers' register budgets set (setmaxnreg), no spill, and the
    ring within the H200's shared memory."""
    import json
    import os
    import subprocess
    import sys

    if fwd_gluon.GLUON_ERROR:
        pytest.skip(fwd_gluon.GLUON_ERROR)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", _COMPILE, str(d), str(block_n), str(stages), str(causal)],
                         capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    k = json.loads(run.stdout.strip().splitlines()[-1])
    ptx = k["ptx"]
    assert "cp.async.bulk.tensor.4d" in ptx and "wgmma.mma_async" in ptx and "setmaxnreg" in ptx
    ring = stages * 2 * block_n * d * 2 + 2 * 64 * d * 2
    assert ring <= k["shared"] <= 227 * 1024
    assert "ld.local" not in ptx and "st.local" not in ptx
    if k["usage"]:
        assert "LOCAL:0" in k["usage"], k["usage"]


# -- on a Hopper GPU ---------------------------------------------------------------------------------
_GPU_CASES = [  # (B, H, Tq, Tk, d, dtype, causal, layout)
    (2, 3, 300, 300, 64, torch.bfloat16, True, "bthd"),  # ragged T, the model's layout
    (1, 2, 1000, 1000, 128, torch.bfloat16, False, "bhtd"),
    (2, 2, 256, 256, 64, torch.float16, True, "qkv"),  # one fused projection's slices
    (1, 2, 100, 333, 128, torch.bfloat16, True, "bhtd"),  # Tq < Tk
    (1, 2, 333, 100, 64, torch.bfloat16, True, "bhtd"),  # Tq > Tk: rows with no key
    (1, 1, 1, 1, 64, torch.bfloat16, True, "bhtd"),  # T = 1
    (1, 4, 2048, 2048, 128, torch.float16, True, "bthd"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", _GPU_CASES, ids=lambda c: f"{c[2]}x{c[3]}-d{c[4]}-{str(c[5])[6:]}-{c[6]}-{c[7]}")
@pytest.mark.parametrize("block_n,stages", [(128, 2), (64, 3)])
def test_gluon_forward_and_gradients_on_the_gpu(case, block_n, stages):
    B, H, tq, tk, d, dtype, causal, layout = case
    q, k, v = make_qkv(B, H, tq, tk, d, dtype, layout=layout, device="cuda")
    why = fwd_gluon.supported(q, k, v)
    if why and "compute capability" in why:
        pytest.skip(why)
    assert why is None, why
    plan = dataclasses.replace(GLUON, block_n=block_n, num_stages=stages)
    _, (out, *_) = run_and_compare(q, k, v, causal=causal, plan=(plan, None))
    _, lse = launch_fwd(q.detach(), k.detach(), v.detach(), d ** -0.5, causal, plan)
    _, lse_ref = launch_fwd(q.detach(), k.detach(), v.detach(), d ** -0.5, causal,
                            plans.FwdPlan(block_m=64, block_n=64))
    assert torch.equal(torch.isinf(lse), torch.isinf(lse_ref))
    fin = torch.isfinite(lse_ref)
    assert torch.allclose(lse[fin], lse_ref[fin], atol=1e-3, rtol=1e-4)
    if causal and tq > tk:
        assert (out[:, :, :tq - tk] == 0).all()
