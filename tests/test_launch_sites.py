"""Prepared launches at the launch sites (the triton softmax's and flash's launchers keep a
``fastlaunch.Prepared`` per shape, strides, dtypes, device, scale and causality): a later call takes the
prepared launch, and gets exactly what the general path gives, for every case that differs from another
in one part of the key only. On the CPU the direct path stands aside (Triton's interpreter), so
``fastlaunch.prepare`` is replaced by a stand-in that launches the kernel, in the interpreter, with the
new tensors and the arguments it was prepared with: a part of the key the sites left out shows as a
wrong output. On a GPU (``gpu`` marker) the real prepared launches against the plain path, bit for bit.
"""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels.methods.triton.softmax import plan as tp
from kernels.methods.triton.softmax.launch import launch_bwd, launch_fwd
from kernels.runtime import fastlaunch as fl

pytestmark = pytest.mark.skipif("triton" not in kernels.runnable_methods(), reason="triton cannot run here")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def standin(monkeypatch):
    """fastlaunch.prepare as the direct path would answer, for the interpreter: a prepared launch launches
    through kernel[grid] with the tensors it is given (which must have the dtypes it was prepared with)
    and the rest of the arguments it was prepared with; returns the kernels the prepared launches ran."""
    if DEVICE == "cuda":
        pytest.skip("the stand-in is for the interpreter; the GPU tests below use the real prepared launches")
    ran = []

    def prepare(kernel, grid, args, meta, device=None):
        n = 0
        while n < len(args) and isinstance(args[n], torch.Tensor):
            n += 1
        rest, dtypes = args[n:], [t.dtype for t in args[:n]]

        def prepared(*tensors):  # (a compiled kernel is specialized on its pointers' dtypes: the key must fix them)
            assert [t.dtype for t in tensors] == dtypes, "a prepared launch given tensors of other dtypes"
            ran.append(kernel)
            kernel[grid](*tensors, *rest, **meta)
            return True

        return prepared

    monkeypatch.setattr(fl, "prepare", prepare)
    fl.clear_sites()
    yield ran
    fl.clear_sites()


def _general(fn, *args):
    """fn(*args) through the general path (no prepared launch kept)."""
    fl.clear_sites()
    out = fn(*args)
    fl.clear_sites()
    return out


# each case differs from another in one part of the sites' key: shape at the same size, rows at the same
# row length (same strides), scale, causality, dtype, dy's dtype, Tq against Tk, a scale whose fill the
# causal forward cannot take (0), and its sign (-0.0: the sign of the zero gradients)
_SOFTMAX_CASES = [((4, 96), torch.float32, None, 0.5, False), ((6, 64), torch.float32, None, 0.5, False),
                  ((4, 64), torch.float32, None, 0.5, False), ((6, 64), torch.float32, None, 0.25, False),
                  ((6, 64), torch.float32, None, 0.5, True), ((6, 64), torch.bfloat16, None, 0.5, False),
                  ((6, 64), torch.bfloat16, torch.float32, 0.5, False), ((2, 8, 12), torch.float32, None, 0.5, True),
                  ((2, 12, 8), torch.float32, None, 0.5, True), ((2, 12, 8), torch.float32, None, 0.0, True),
                  ((2, 12, 8), torch.float32, None, -0.0, True)]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, signs of zeros, strides and dtype."""
    return (a.dtype == b.dtype and a.stride() == b.stride() and torch.equal(a, b)
            and torch.equal(torch.signbit(a), torch.signbit(b)))


def test_softmax_sites_reuse_only_what_their_key_fixes(standin, seeded):
    data = [(torch.randn(s, generator=seeded).to(dt), torch.randn(s, generator=seeded).to(ddt or dt), sc, c)
            for s, dt, ddt, sc, c in _SOFTMAX_CASES]
    want = []
    for x, dy, sc, c in data:
        y = _general(launch_fwd, x, sc, c)
        want.append((y, _general(launch_bwd, y, dy, sc, c)))
    for _ in range(2):  # interleaved: every case's site made, then taken, with the others' sites kept
        before = len(standin)
        for (x, dy, sc, c), (y_want, dx_want) in zip(data, want):
            y = launch_fwd(x, sc, c)
            dx = launch_bwd(y, dy, sc, c)
            assert _same(y, y_want) and _same(dx, dx_want), (tuple(x.shape), x.dtype, dy.dtype, sc, c)
    assert len(standin) - before == 2 * len(data)  # the second round, forward and backward, all prepared


def test_softmax_sites_skip_what_they_cannot_take(standin, seeded):
    """A transposed input, a forced plan: the general path every time; a plan table edited: its sites gone."""
    x = torch.randn(8, 24, generator=seeded).t()
    for _ in range(2):
        launch_fwd(x, 0.5, False)
        launch_fwd(x.contiguous(), 0.5, False, p=tp.cached_plan(8, 4))
    assert standin == []
    c = x.contiguous()
    for _ in range(2):
        launch_fwd(c, 0.5, False)
    assert len(standin) == 1
    tp.clear_plan_cache()
    launch_fwd(c, 0.5, False)
    assert len(standin) == 1


def test_a_site_cache_is_bounded_and_cleared():
    cache = fl.SiteCache(limit=3)
    for i in range(3):
        cache.put(i, i)
    assert len(cache) == 3
    cache.put(3, 3)
    assert dict(cache) == {3: 3}
    fl.clear_sites()
    assert not cache
    cache.put(1, 1)
    fl.clear()
    assert not cache


def _flash_cases():
    from tests.test_flash_attention import make_qkv

    # differing in scale, causality, Tq against Tk, layout (strides), dtype, dv, do's layout
    specs = [(1, 2, 20, 20, 16, 16, torch.float32, "bhtd", 0.25, True, False),
             (1, 2, 20, 20, 16, 16, torch.float32, "bhtd", 0.5, True, False),
             (1, 2, 20, 20, 16, 16, torch.float32, "bhtd", 0.25, False, False),
             (1, 2, 20, 20, 16, 16, torch.float32, "bthd", 0.25, True, False),
             (1, 2, 12, 20, 16, 16, torch.float32, "bhtd", 0.25, True, False),
             (1, 2, 20, 20, 16, 16, torch.bfloat16, "bhtd", 0.25, True, False),
             (1, 2, 20, 20, 16, 32, torch.float32, "bhtd", 0.25, True, False),
             (1, 2, 20, 20, 16, 16, torch.float32, "bhtd", 0.25, True, True)]
    out = []
    for i, (B, H, tq, tk, d, dv, dt, layout, scale, causal, do_bthd) in enumerate(specs):
        q, k, v = (t.detach() for t in make_qkv(B, H, tq, tk, d, dt, layout=layout, dv=dv, seed=i))
        g = torch.Generator().manual_seed(99 + i)
        do = (torch.randn(B, tq, H, dv, generator=g).to(dt).transpose(1, 2) if do_bthd
              else torch.randn(B, H, tq, dv, generator=g).to(dt))
        out.append((q, k, v, do, scale, causal))
    return out


@pytest.fixture(params=[False, pytest.param(True, marks=pytest.mark.slow)], ids=["delta-kernel", "delta-in-dq"])  # (~5 s each)
def delta_in_dq(request, monkeypatch):
    """The flash plans as they are, or every shape on the default plans with BwdPlan.delta_in_dq (no delta
    kernel: dq first; the table's entries set aside, so the GPU shapes it covers take the switch too)."""
    import dataclasses

    from kernels.methods.flash import plan as plans

    if request.param:
        real = plans.default_plans
        monkeypatch.setattr(plans, "default_plans",
                            lambda *a: (real(*a)[0], dataclasses.replace(real(*a)[1], delta_in_dq=True)))
        monkeypatch.setattr(plans, "table_plans", lambda *a: None)
    plans.forget()
    yield request.param
    plans.forget()


def test_flash_sites_reuse_only_what_their_key_fixes(standin, delta_in_dq):
    if "flash" not in kernels.runnable_methods(op="attention"):
        pytest.skip("flash cannot run here")
    from kernels.methods.flash.bwd import launch_bwd as flash_bwd
    from kernels.methods.flash.fwd import launch_fwd as flash_fwd

    cases = _flash_cases()
    want = []
    for q, k, v, do, scale, causal in cases:
        out, lse = _general(flash_fwd, q, k, v, scale, causal)
        want.append((out, lse, *_general(flash_bwd, do, q, k, v, out, lse, scale, causal)))
    for _ in range(2):
        before = len(standin)
        for (q, k, v, do, scale, causal), w in zip(cases, want):
            out, lse = flash_fwd(q, k, v, scale, causal)
            got = (out, lse, *flash_bwd(do, q, k, v, out, lse, scale, causal))
            for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, w):
                assert _same(a, b), (name, tuple(q.shape), q.stride(), scale, causal)
    # the second round, all prepared: forward, delta, and dk/dv then dq (the default plans at d <= 32: unfused);
    # with delta in the dq pass: forward, dq, dk/dv
    assert len(standin) - before == (3 if delta_in_dq else 4) * len(cases)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,causal,layout", [((2, 4, 256, 64), True, "bthd"), ((2, 4, 300, 128), False, "bhtd"),
                                                 ((1, 2, 1000, 64), True, "qkv")])
def test_flash_prepared_launches_match_plain_ones_on_the_gpu(shape, causal, layout, delta_in_dq):
    """flash's forward and backward through the real prepared launches (the direct path, second and third
    calls) give bit for bit what the plain kernel[grid] launches give."""
    from kernels.methods.flash import bwd as fb, fwd as ff
    from tests.test_flash_attention import make_qkv

    assert fl.unsupported_reason() is None, fl.unsupported_reason()
    B, H, T, d = shape
    q, k, v = (t.detach() for t in make_qkv(B, H, T, T, d, torch.bfloat16, layout=layout))
    do = torch.randn(B, H, T, d, device=DEVICE, dtype=torch.bfloat16)
    runs = {}
    for direct in (False, True):
        fl.configure(direct)
        fl.clear()
        runs[direct] = []
        for _ in range(3):
            out, lse = ff.launch_fwd(q, k, v, d ** -0.5, causal)
            runs[direct].append((out, lse, *fb.launch_bwd(do, q, k, v, out, lse, d ** -0.5, causal)))
        if direct:
            assert len(ff._SITES) == 1 and len(fb._SITES) == 1, "no prepared launch was kept"
    fl.configure()
    torch.cuda.synchronize()
    for got in runs[True]:
        for a, b in zip(got, runs[False][0]):
            assert torch.equal(a, b)


def test_flash_backward_sites_write_into_given_gradients(standin):
    """Gradients handed to the backward (views of one packed dqkv: attention_qkv) are the ones written and
    returned, prepared or not; a site kept for new gradients is not the one for given ones (their strides)."""
    if "flash" not in kernels.runnable_methods(op="attention"):
        pytest.skip("flash cannot run here")
    from kernels.contract import split_qkv
    from kernels.methods.flash.bwd import launch_bwd as flash_bwd
    from kernels.methods.flash.fwd import launch_fwd as flash_fwd

    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(1, 20, 96, generator=g)
    q, k, v = split_qkv(qkv, 2)
    do = torch.randn(1, 2, 20, 16, generator=g)
    out, lse = _general(flash_fwd, q, k, v, 0.25, True)
    want = _general(flash_bwd, do, q, k, v, out, lse, 0.25, True)
    flash_bwd(do, q, k, v, out, lse, 0.25, True)  # a site for new gradients
    for _ in range(2):  # the first call keeps a site for given ones, the second runs it
        dqkv = torch.full_like(qkv, float("nan"))
        before = len(standin)
        got = flash_bwd(do, q, k, v, out, lse, 0.25, True, grads=split_qkv(dqkv, 2))
        assert all(a.data_ptr() == b.data_ptr() for a, b in zip(got, split_qkv(dqkv, 2)))
        assert torch.equal(dqkv, torch.cat([w.transpose(1, 2).reshape(1, 20, 32) for w in want], dim=2))
    assert len(standin) - before == 3  # prepared: delta, dk/dv, dq
