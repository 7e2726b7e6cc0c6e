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


def _prepared_standin(run, kernel, grid, args, meta):
    """What fastlaunch.prepare returns, for tests: a callable that takes the changing arguments (tensors and
    TMA descriptors, in the order of their positions: ``Prepared`` and ``PreparedSlots`` alike), puts them in
    their places among the others and hands the whole launch to ``run``. A tensor of another dtype than
    the one it was prepared with fails (a compiled kernel is specialized on its pointers' dtypes: the
    site's key must fix them)."""
    from kernels.methods.flash import gluon_common

    kinds = (torch.Tensor,) + ((gluon_common.GluonDescriptor,) if gluon_common.GluonDescriptor else ())
    slots = [i for i, a in enumerate(args) if isinstance(a, kinds)]

    def prepared(*changing):
        full = list(args)
        for i, x in zip(slots, changing):
            if isinstance(x, torch.Tensor):
                assert x.dtype == args[i].dtype, "a prepared launch given tensors of other dtypes"
            full[i] = x
        run(kernel, grid, tuple(full), meta)
        return True

    return prepared


@pytest.fixture
def standin(monkeypatch):
    """fastlaunch.prepare as the direct path would answer, for the interpreter: a prepared launch launches
    through kernel[grid] with the tensors it is given (which must have the dtypes it was prepared with)
    and the rest of the arguments it was prepared with; returns the kernels the prepared launches ran."""
    if DEVICE == "cuda":
        pytest.skip("the stand-in is for the interpreter; the GPU tests below use the real prepared launches")
    ran = []

    def run(kernel, grid, args, meta):
        ran.append(kernel)
        kernel[grid](*args, **meta)

    monkeypatch.setattr(fl, "prepare", lambda kernel, grid, args, meta, device=None: _prepared_standin(
        run, kernel, grid, args, meta))
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
                                                 ((1, 2, 1000, 64), True, "qkv"), ((2, 4, 2048, 64), True, "bhtd"),
                                                 ((1, 4, 2048, 128), True, "bthd")])
def test_flash_prepared_launches_match_plain_ones_on_the_gpu(shape, causal, layout, delta_in_dq):
    """flash's forward and backward through the real prepared launches (the direct path, second and third
    calls, every launch of the third prepared) give bit for bit what the plain kernel[grid] launches give;
    at T = 2048 the Gluon plans (descriptors rebuilt per call, ``replay``), whose dq a plan may sum by TMA
    adds in a varying order: that dq to within its rounding."""
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
        for i in range(3):
            fl.reset_counts()
            out, lse = ff.launch_fwd(q, k, v, d ** -0.5, causal)
            runs[direct].append((out, lse, *fb.launch_bwd(do, q, k, v, out, lse, d ** -0.5, causal)))
        if direct:
            assert len(ff._SITES) == 1 and len(fb._SITES) == 1, "no prepared launch was kept"
            assert set(fl.counts()) == {"prepared"}, fl.counts()  # (the third call's launches)
    fl.configure()
    torch.cuda.synchronize()
    for got in runs[True] + runs[False][1:]:
        for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, runs[False][0]):
            if name == "dq" and T > 1024:
                scale = b.float().abs().max()
                assert (a.float() - b.float()).abs().max() <= 1e-2 * scale, name
            else:
                assert torch.equal(a, b), name


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


@pytest.fixture
def gluon_standin(monkeypatch):
    """The Gluon plans' launch sites on the CPU, their kernels not run: the Gluon input checks pass, every
    launch is recorded as (kernel, grid, arguments, meta) instead of run, and fastlaunch.prepare returns a
    stand-in that records the arguments a prepared launch would pass (the new tensors and descriptors in
    their positions), marked "prepared"."""
    from kernels.methods.flash import bwd as fb, fwd_gluon, gluon_common

    if gluon_common.GLUON_ERROR:
        pytest.skip(gluon_common.GLUON_ERROR)
    if DEVICE == "cuda":
        pytest.skip("on a GPU the real Gluon launches run (test_flash_prepared_launches_match_plain_ones_on_the_gpu)")
    log = []
    monkeypatch.setattr(gluon_common, "supported", lambda q, k, v: None)
    monkeypatch.setattr(fb, "tma_eligible", lambda *t: True)
    monkeypatch.setattr(fwd_gluon, "device_props", lambda dev: type("Props", (), {"multi_processor_count": 132}))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    def record(how, kernel, grid, args, meta):
        log.append((how, kernel, grid, tuple(args), dict(meta)))
        for a in args:  # (an effect to read back: the fp32 dq sums, where a launch takes them, hold 3)
            if isinstance(a, torch.Tensor) and a.dtype == torch.float32 and a.dim() == 4:
                a.fill_(3.0)

    monkeypatch.setattr(fl, "launch", lambda kernel, grid, args, meta, device=None: record("general", kernel, grid,
                                                                                           args, meta))

    monkeypatch.setattr(fl, "prepare", lambda kernel, grid, args, meta, device=None: _prepared_standin(
        lambda *launch: record("prepared", *launch), kernel, grid, args, meta))
    fl.clear_sites()
    yield log
    fl.clear_sites()


@pytest.mark.parametrize("d,deterministic,given", [(64, False, False), (64, True, False), (128, False, True)])
def test_gluon_sites_replay_the_launches_a_general_call_makes(gluon_standin, monkeypatch, d, deterministic, given):
    """The Gluon plans' sites (kernels.methods.flash.replay): a later call with new tensors of the same key
    launches, prepared, exactly what the general path launches for those tensors: every kernel, grid and
    meta, each tensor argument the call's own, each descriptor rebuilt from the right tensor with the same
    box and layout (d = 64: delta, dk/dv adding dq by TMA; deterministic: then the Triton dq pass; d = 128:
    the Gluon dq pass forming delta, then dk/dv, into given gradients)."""
    from kernels.methods.flash import bwd as fb, fwd as ff, gluon_common

    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: deterministic)
    log = gluon_standin

    def inputs(seed):
        g = torch.Generator().manual_seed(seed)
        q, k, v, do = (torch.randn(1, 2, 2048, d, generator=g).to(torch.bfloat16) for _ in range(4))
        out, lse = torch.randn(1, 2048, 2, d).to(torch.bfloat16).transpose(1, 2), torch.randn(1, 2, 2048)
        grads = tuple(torch.empty_like(q) for _ in range(3)) if given else None
        return q, k, v, do, out, lse, grads

    def call(q, k, v, do, out, lse, grads):
        start = len(log)
        fwd_out = ff.launch_fwd(q, k, v, d ** -0.5, True)
        got = fb.launch_bwd(do, q, k, v, out, lse, d ** -0.5, True, grads=grads)
        return log[start:], (*fwd_out, *got)

    first, _ = call(*inputs(0))
    assert all(e[0] == "general" for e in first)
    names = [e[1].fn.__name__ for e in first]
    assert names == {(64, False): ["_fwd_ws_kernel", "_delta_kernel", "_dkdv_ws_kernel"],
                     (64, True): ["_fwd_ws_kernel", "_delta_kernel", "_dkdv_ws_kernel", "_bwd_kernel"],
                     (128, False): ["_fwd_ws_kernel", "_dq_ws_kernel", "_dkdv_ws_kernel"]}[d, deterministic], names
    new = inputs(1)
    replayed, got = call(*new)
    assert [e[0] for e in replayed] == ["prepared"] * len(first)
    fl.clear_sites()
    general, want = call(*new)
    assert [e[0] for e in general] == ["general"] * len(first)
    # the call's inputs (and given gradients) must be the very objects; what each call allocates (out, lse,
    # delta, the dq sums, new gradients) may not, but must match one to one across every launch, in layout
    held = [t for t in (*new[:6], *(new[6] or ())) if t is not None]
    pair: dict = {}

    def same(a, b) -> bool:
        if isinstance(a, torch.Tensor):
            if any(a is t for t in held):
                return a is b
            return (isinstance(b, torch.Tensor) and pair.setdefault(id(a), b) is b and a.shape == b.shape
                    and a.stride() == b.stride() and a.dtype == b.dtype)
        if isinstance(a, gluon_common.GluonDescriptor):
            return (isinstance(b, gluon_common.GluonDescriptor) and same(a.base, b.base)
                    and list(a.shape) == list(b.shape) and list(a.strides) == list(b.strides)
                    and list(a.block_shape) == list(b.block_shape) and a.layout == b.layout)
        return a == b

    for r, g in zip(replayed, general):
        assert r[1] is g[1] and tuple(r[2]) == tuple(g[2]) and r[4] == g[4] and len(r[3]) == len(g[3])
        for i, (a, b) in enumerate(zip(r[3], g[3])):
            assert same(a, b), (r[1].fn.__name__, i)
    assert all(same(a, b) for a, b in zip(got, want))  # out, lse and the gradients the launches wrote
    if d == 64 and not deterministic:  # dq from the sums the dk/dv pass added into, in both
        assert torch.all(got[2] == 3) and torch.all(want[2] == 3)


def test_replay_takes_only_calls_it_can_trace():
    """replay.steps keeps no site where two names hold one tensor (q passed as k: a later call's distinct
    tensors could not be told apart) or where an argument is none of the named tensors."""
    from kernels.methods.flash import replay

    a, b, c = torch.zeros(4), torch.zeros(4), torch.zeros(4)
    assert replay.recipe((a, 3, b, 0.5, True), {"q": a, "k": b}) == ("q", "k")
    assert replay.recipe((a, c), {"q": a, "k": b}) is None  # c is not named
    assert replay.recipe((a, "x"), {"q": a}) is None
    assert replay.steps([(None, (1,), (a,), {})], {"q": a, "k": a}) is None


def test_a_host_descriptor_forward_keeps_no_site(standin, monkeypatch):
    """A forward plan that reads by host TMA descriptors (tma="host": they hold their tensors) keeps no
    prepared launch: a repeat takes the general path and gets what it gives (a site would have put the new
    tensors where the descriptors go)."""
    if "flash" not in kernels.runnable_methods(op="attention"):
        pytest.skip("flash cannot run here")
    import dataclasses

    from kernels.methods.flash import fwd as ff
    from kernels.methods.flash import plan as plans

    real = plans.plans_for
    monkeypatch.setattr(plans, "plans_for", lambda *a: (dataclasses.replace(real(*a)[0], tma="host", gluon=0),
                                                        real(*a)[1]))
    q, k, v, _, scale, causal = _flash_cases()[0]
    want = _general(ff.launch_fwd, q, k, v, scale, causal)
    for _ in range(2):
        got = ff.launch_fwd(q, k, v, scale, causal)
        assert all(_same(a, b) for a, b in zip(got, want))
    assert len(ff._SITES) == 0 and not standin
