"""`cce` (kernels/methods/cce.py): Apple's Cut Cross-Entropy as the linear cross-entropy of a public peer.
Its Triton kernels need a GPU (they do not run in Triton's interpreter), so on the CPU: why it is
unavailable, and the adapter's mapping of the op's contract (shapes, reduction, ignore_index, the
result's dtype, autocast) onto a stand-in ``cut_cross_entropy`` module that computes what CCE documents
(``F.cross_entropy((e @ c.T).float(), targets)``). Its accel config and its place in the loss benchmark's
linear rows beside Liger."""

from __future__ import annotations

import argparse
import importlib.util
import sys
import types

import pytest
import torch
import torch.nn.functional as F

import kernels
from harness.bench import loss as loss_bench
from harness.study import plan
from kernels import ops
from kernels.methods import cce
from kernels.ops.linear_cross_entropy import reference_linear_cross_entropy
from kernels.registry import op_function
from tests.test_accel_loss_method import compose_cfg


@pytest.fixture
def fake_cce(monkeypatch):
    """A stand-in ``cut_cross_entropy`` module; the calls it received."""
    calls = []

    def linear_cross_entropy(e, c, targets, ignore_index=-100, softcap=None, reduction="mean", shift=False,
                             filter_eps="high", impl="cce"):
        calls.append({"e": e, "c": c, "targets": targets, "ignore_index": ignore_index, "reduction": reduction,
                      "impl": impl})
        return F.cross_entropy((e @ c.T).float(), targets, ignore_index=ignore_index, reduction=reduction)

    monkeypatch.setitem(sys.modules, "cut_cross_entropy", types.SimpleNamespace(linear_cross_entropy=linear_cross_entropy))
    return calls


def _op():
    """The op as a bound function wraps cce's (the contract's checks, the reshape of 'none')."""
    return ops.get("linear_cross_entropy").wrap(cce.cce_linear_cross_entropy, None)


def test_unavailable_without_the_package_or_without_a_gpu(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name == "cut_cross_entropy" else real(name, *a, **k))
    assert "cut-cross-entropy is not installed" in cce.unavailable_reason()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, **k: object())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "needs a CUDA GPU" in cce.unavailable_reason()  # even with TRITON_INTERPRET=1 (set by conftest)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cce.unavailable_reason() is None


def test_registered_with_a_linear_cross_entropy_alone():
    m = kernels.available_methods(op="linear_cross_entropy")["cce"]
    assert dict(m.ops) == {"linear_cross_entropy": "native"}
    here = importlib.util.find_spec("cut_cross_entropy") is not None and torch.cuda.is_available()
    assert m.available == here and (here or "cut-cross-entropy" in m.reason or "CUDA GPU" in m.reason)
    assert "cce" not in kernels.available_methods(op="cross_entropy")


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_the_adapter_maps_the_contract(fake_cce, reduction):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 5, 8, generator=g, requires_grad=True)
    weight = torch.randn(11, 8, generator=g, requires_grad=True)
    targets = torch.randint(0, 11, (2, 5), generator=g)
    targets[0, 1] = targets[1, 4] = -7
    out = _op()(hidden, weight, targets, -7, reduction)
    ref = reference_linear_cross_entropy(hidden, weight, targets, ignore_index=-7, reduction=reduction)
    assert out.dtype == torch.float32 and out.shape == ref.shape
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-6)
    if reduction == "none":
        assert out[0, 1] == 0 and out[1, 4] == 0  # ignored targets: 0
    call, = fake_cce
    assert call["e"].shape == (10, 8) and call["c"] is weight and call["targets"].dtype == torch.int64
    assert call["targets"].shape == (10,) and (call["ignore_index"], call["reduction"], call["impl"]) == (-7, reduction, "cce")
    out.sum().backward()  # the gradients flow back to the caller's tensors
    assert hidden.grad.shape == hidden.shape and weight.grad.shape == weight.shape


def test_a_16_bit_loss_comes_back_in_float32_and_autocast_casts_both_inputs(fake_cce):
    hidden, weight = torch.randn(6, 8).bfloat16(), torch.randn(11, 8)
    targets = torch.randint(0, 11, (6,))
    with pytest.raises(TypeError, match="need one dtype outside autocast"):
        _op()(hidden, weight, targets, -100, "mean")
    with torch.autocast("cpu", torch.bfloat16):
        out = _op()(hidden, weight, targets, -100, "mean")
    assert out.dtype == torch.float32
    assert fake_cce[-1]["e"].dtype == fake_cce[-1]["c"].dtype == torch.bfloat16


def test_the_cce_config_is_sdpa_with_cce_for_the_loss_and_says_why_it_cannot_run():
    a = compose_cfg("accel=cce", "model=tiny", "trainer=cpu").accel
    assert (a.method, dict(a.options), a.loss_method, a.loss_form) == ("sdpa", {"backend": "auto"}, "cce", "linear")
    if kernels.unavailable_reason("cce"):
        assert plan.unavailable("cce").startswith("its loss_method 'cce': ")


def test_the_loss_table_keeps_a_linear_only_method_for_the_linear_rows(tmp_path):
    """``--methods`` naming a method with a linear cross-entropy alone (cce, where it can run): its linear
    row beside the others', no cross-entropy row for it."""
    name = "_test_linear_only"
    torch_linear = op_function(kernels.get_method("torch"), "linear_cross_entropy", {})  # (composed)
    kernels.register(kernels.Method(name=name, summary="test: a linear cross-entropy alone",
                                    linear_cross_entropy=torch_linear))
    try:
        args = argparse.Namespace(methods=f"torch,{name}", vocabs="17", tokens=8, linear="8,12,33", rep_ms=2,
                                  out=tmp_path)
        rows = loss_bench.run(args, pytest.fail)
    finally:
        kernels.unregister(name)
    assert {(r.method, r.op) for r in rows if not r.autocast} == {
        ("torch", "cross_entropy"), ("torch", "linear_cross_entropy"), (name, "linear_cross_entropy")}
    assert all(r.correct for r in rows if not r.error), rows
