"""The op table: adding an op is one entry. A throw-away ``double`` op (x -> 2 x) and ``quadruple``
(composed from it: twice double), put into a copy of the table, are accepted by ``kernels.Method``,
bound, checked, composed and gated, with no other module changed."""

from __future__ import annotations

from types import MappingProxyType

import pytest
import torch

import kernels
from harness import gate
from kernels import ops, registry
from kernels.ops import GateCase, Judged, Op


def _toy(name: str, factor: float, **fields) -> Op:
    """An op ``name``: x -> factor x on float tensors, with its check, float64 reference and gate case."""
    def wrap(fn, validate):
        def bound(x):
            if not isinstance(x, torch.Tensor) or not x.is_floating_point():
                raise TypeError(f"{name} takes a float tensor")
            if validate is not None:
                validate(x)
            return fn(x)

        return bound

    def entry(lookup):
        def one_shot(x, *, method="torch", **options):
            return lookup(method, name, options)(x)

        return one_shot

    def reference(x):
        return factor * x.to(torch.float64)

    def gate_case(shapes, heads, seed=0):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(shapes.tokens, shapes.n_embd, generator=g).to(shapes.device, shapes.dtype).requires_grad_(True)
        dy = torch.randn(x.shape, generator=g).to(shapes.device, shapes.dtype)

        def judge(y):
            x64 = x.detach().to(torch.float64).requires_grad_(True)
            ref = reference(x64)
            ref.backward(dy.to(torch.float64))
            return Judged([y, x.grad], [ref, x64.grad], 1e-6, 1e-6)

        return GateCase(tuple(x.shape), shapes.dtype, (x,), dy, judge)

    return Op(name, f"{name}(x)", wrap, entry, reference, gate_case, **fields)


DOUBLE = _toy("double", 2.0)
QUADRUPLE = _toy("quadruple", 4.0, composed_from="double",
                 compose=lambda double: lambda x, **o: double(double(x, **o), **o))
SHAPES = ops.RunShapes(heads=2, seq_len=8, head_dim=4, vocab=16, n_embd=8, tokens=5, dtype=torch.float32, device="cpu")


TOY_METHODS = ("_toy", "_toy_wrong")


@pytest.fixture
def toy_table(monkeypatch):
    """A copy of the table with the two toy ops in it; the toy methods are removed after, then the table."""
    monkeypatch.setattr(ops, "TABLE", MappingProxyType({**ops.TABLE, "double": DOUBLE, "quadruple": QUADRUPLE}))
    yield
    for name in TOY_METHODS:
        kernels.unregister(name)


def test_a_method_may_implement_an_op_of_the_table_and_no_other(toy_table):
    m = kernels.Method("_toy", summary="toy", double=lambda x: 2 * x)
    assert m.ops() == {"double": "native", "quadruple": "composed"}
    assert m.double is not None and m.quadruple is None and m.softmax is None
    with pytest.raises(TypeError, match="unexpected keyword argument 'triple'"):
        kernels.Method("_toy", summary="toy", triple=lambda x: 3 * x)


def test_a_new_op_is_bound_checked_composed_and_gated(toy_table):
    name = kernels.register(kernels.Method("_toy", summary="toy", double=lambda x: x + x)).name
    x = torch.randn(3, 4)
    double = kernels.bind(name, "double")
    assert double.__name__ == "double[_toy]" and torch.equal(double(x), 2 * x)
    assert double is kernels.bind(name, "double")  # cached like every op
    with pytest.raises(TypeError, match="double takes a float tensor"):  # the entry's check, before the method
        double(torch.ones(2, dtype=torch.int64))
    assert torch.equal(kernels.bind(name, "quadruple")(x), 4 * x)  # composed, as the entry declares
    assert torch.equal(registry.entry_point("quadruple")(x, method=name), 4 * x)  # its one-shot entry point
    with pytest.raises(kernels.OpNotImplementedError, match="'torch' does not implement quadruple.*here: _toy"):
        kernels.bind("torch", "quadruple")
    for op in ("double", "quadruple"):
        res = gate.check_op(name, op, SHAPES)
        assert res.passed and res.op == op and res.shape == (5, 8), res

    wrong = kernels.register(kernels.Method("_toy_wrong", summary="wrong", double=lambda x: 2.01 * x)).name
    res = gate.check_op(wrong, "quadruple", SHAPES)
    assert not res.passed and "forward error" in res.reason and "backward error" in res.reason, res


def test_the_table_is_left_as_it_was():
    assert "double" not in ops.TABLE and ops.names() == kernels.OPS
    with pytest.raises(ValueError, match="unknown op 'double'"):
        kernels.bind("torch", "double")
