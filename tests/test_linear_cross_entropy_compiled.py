"""The triton linear cross-entropy traced by torch.compile: its backward multiplies the saved gradients
out of place (so Inductor fuses the product into their consumers instead of first copying them, as it
does before an in-place scale of a saved tensor), with the eager results."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd

import kernels
from kernels.methods.triton.cross_entropy.launch import defers_scale
from tests.test_cross_entropy import DEVICE, linear_inputs


def _compile_recording(fn):
    """fn compiled through AOTAutograd (no code generation); returns it and the backward graphs' op names."""
    ops = []

    def backward(gm, _inputs):
        ops.extend(f"{n.target} {n.args}" for n in gm.graph.nodes if n.op == "call_function")
        return gm

    return torch.compile(fn, fullgraph=True, backend=aot_autograd(fw_compiler=lambda gm, _: gm,
                                                                  bw_compiler=backward)), ops


def _half_gemms() -> bool:
    if DEVICE != "cpu":
        return True
    try:
        torch.ones(2, 2, dtype=torch.float16) @ torch.ones(2, 2, dtype=torch.float16)
    except RuntimeError:
        return False
    return True


@pytest.mark.parametrize("session_flag", [True, False], ids=["session-flag", "no-session-flag"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_compiled_backward_scales_out_of_place_with_the_eager_gradients(dtype, reduction, session_flag,
                                                                        monkeypatch):
    """session_flag=False: as torch 2.11 traces (torch.compiler.is_compiling() False in AOTAutograd's trace
    of the backward; torch 2.13 holds it True for the whole compile session)."""
    if dtype == torch.float16 and not _half_gemms():
        pytest.skip("this PyTorch has no float16 GEMMs on the CPU")
    if not session_flag:
        monkeypatch.setattr(torch.compiler, "_compile_session_context", contextlib.nullcontext, raising=False)
    lin = kernels.bind("triton", "linear_cross_entropy")

    def f(h, w, t, k):
        return lin(h, w, t, -100, reduction) * k  # k = 1/3: grad_output not a no-op, and inexact in 16 bits

    h, w, t = linear_inputs(n=12, c=8, v=33)
    t[::5] = -100
    runs = []
    torch._dynamo.reset()  # (f's code object is every case's: without a reset the cases past Dynamo's recompile
    # limit of 8 fail under fullgraph, and a cached graph would leave this case's backward unrecorded)
    compiled_f, ops = _compile_recording(f)
    for fn, k in ((f, 1.0), (f, 1 / 3), (compiled_f, 1 / 3)):
        x = [a.detach().to(dtype).requires_grad_(True) for a in (h, w)]
        loss = fn(*x, t, k)
        loss.backward()
        runs.append((loss, [a.grad for a in x]))
    # no in-place scale of a saved tensor (functionalized: auto_functionalized of triton_cross_entropy_bwd)
    assert ops, "the compiled backward graph was not recorded"
    assert not any("triton_cross_entropy_bwd" in op or "auto_functionalized" in op for op in ops), ops
    assert torch.allclose(runs[2][0], runs[1][0], rtol=1e-6, atol=0)
    # what the backward scales: the forward op's saved gradients (float16: not yet divided by n_valid, and
    # grad_weight still fp32), each times grad_output (/ n_valid) in fp32 and rounded once to its dtype
    x = [a.detach().to(dtype) for a in (h, w)]
    _, count, gh, gw = torch.ops.softmax_harness.triton_linear_cross_entropy_fwd(*x, t, -100, reduction, True, True)
    factor = torch.tensor(1 / 3, dtype=torch.float32, device=h.device)
    deferred = reduction == "mean" and defers_scale(dtype)  # (float16: 1 / n_valid applied by the backward)
    if deferred:
        factor = factor / count.clamp(min=1.0).reshape(())
    for saved, unscaled, eager, compiled in zip((gh, gw), runs[0][1], runs[1][1], runs[2][1]):
        assert compiled.dtype == eager.dtype == dtype
        if not deferred:
            assert torch.equal(saved.to(dtype), unscaled)  # the op's gradients: those of the run with grad_output 1
        assert torch.equal(compiled, (saved.float() * factor).to(dtype))  # fp32 products, rounded once
        ulp = 1e-6 if dtype == torch.float32 else 2.0 ** -7  # (Triton's interpreter may round otherwise)
        assert torch.allclose(compiled.float(), eager.float(), rtol=ulp, atol=0)
