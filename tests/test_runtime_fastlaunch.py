"""The Triton direct-launch path (kernels.runtime.fastlaunch): its key against Triton's own
specialization, the direct path's logic on a stand-in kernel (no GPU: the launcher is a recorder), the
fallback under the interpreter and the environment switch; on a GPU, every softmax path direct against
plain, bit for bit, and a differently aligned tensor never reusing a compiled specialization."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch

import kernels
from kernels.methods.triton.softmax import plan as tp
from kernels.methods.triton.softmax.launch import launch_bwd, launch_fwd
from kernels.runtime import fastlaunch as fl
from kernels.runtime import run_source

pytestmark = pytest.mark.skipif("triton" not in kernels.runnable_methods(), reason="triton cannot run here")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _native(a):
    from triton.backends import BaseBackend
    from triton.runtime.jit import native_specialize_impl

    return native_specialize_impl(BaseBackend, a, False, True, True)


def test_key_splits_arguments_exactly_as_triton_specializes_them():
    """Two arguments get the same key part iff Triton's native_specialize_impl gives them the same
    specialization (dtype, 16-byte alignment of an address; an int's width, divisibility by 16, == 1)."""
    buf = torch.zeros(64, dtype=torch.bfloat16)
    args = [buf, buf[8:], buf[1:], buf[4:], torch.zeros(8), torch.zeros(8, dtype=torch.float16), 0, 1, 2, 16, 17,
            -16, -1, 2**31 - 16, 2**31, 2**32 + 16, 2**63, 2**64 - 16, 0.5, 1.0, True, False]
    parts = [fl.launch_key((a,), {}, 0)[0][3] for a in args]
    for i, a in enumerate(args):
        for j, b in enumerate(args):
            assert (parts[i] == parts[j]) == (_native(a) == _native(b)), (a, b)


def test_key_covers_constexprs_options_device_and_is_stable():
    x = torch.zeros(32, 16)
    k = lambda args, meta, dev=0: fl.launch_key(args, meta, dev)[0]  # noqa: E731
    base = k((x, 16, 0.5), dict(BLOCK_N=16, CAUSAL=False, num_warps=4))
    assert base == k((x, 16, 0.5), dict(BLOCK_N=16, CAUSAL=False, num_warps=4))  # same arguments, same key
    assert base == k((x.clone(), 32, 0.25), dict(BLOCK_N=16, CAUSAL=False, num_warps=4))  # (new buffers are aligned)
    for other in (k((x, 16, 0.5), dict(BLOCK_N=32, CAUSAL=False, num_warps=4)),
                  k((x, 16, 0.5), dict(BLOCK_N=16, CAUSAL=True, num_warps=4)),
                  k((x, 16, 0.5), dict(BLOCK_N=16, CAUSAL=False, num_warps=8)),
                  k((x, 16, 0.5), dict(BLOCK_N=16, CAUSAL=False, num_warps=4, maxnreg=64)),
                  k((x, 16, 0.5), dict(BLOCK_N=16, CAUSAL=False, num_warps=4), dev=1),
                  k((x.view(-1)[1:], 16, 0.5), dict(BLOCK_N=16, CAUSAL=False, num_warps=4)),
                  k((x.half(), 16, 0.5), dict(BLOCK_N=16, CAUSAL=False, num_warps=4)),
                  k((x, 17, 0.5), dict(BLOCK_N=16, CAUSAL=False, num_warps=4)),
                  k((x, 1, 0.5), dict(BLOCK_N=16, CAUSAL=False, num_warps=4)),
                  k((x, 16, 1), dict(BLOCK_N=16, CAUSAL=False, num_warps=4))):  # an int scale of 1 is a constexpr
        assert other != base
    assert fl.launch_key((x,), {}, 0, require_cuda=True) is None or x.is_cuda


def test_run_source_check():
    """The installed Triton's JITFunction.run is one this module knows; a changed one is refused (an
    unknown knob read, a missing launch call, any unknown source unless forced)."""
    from triton.runtime.jit import JITFunction

    src = inspect.getsource(JITFunction.run)
    assert run_source.source_digest(src) in run_source.KNOWN_RUN_SOURCES
    why, knobs, _ = run_source.check_run_source(src)
    assert why is None and ("runtime", "debug") in knobs and ("compilation", "instrumentation_mode") in knobs
    assert "not a version" in run_source.check_run_source(src + "\n        x = 1\n")[0]
    extra = src.replace("        # parse options", '        kwargs["new"] = knobs.compilation.new\n        # parse options')
    assert "unknown knob" in run_source.check_run_source(extra, force=True)[0]
    moved = src.replace("kernel.run(grid_0", "kernel.run_new(grid_0")
    assert "has no line" in run_source.check_run_source(moved, force=True)[0]


class _Compiled:
    def __init__(self, log):
        self.function, self.packed_metadata, self.log, self.fail = 1234, (4, 1, 0), log, False

    def run(self, *a):
        if self.fail:
            raise RuntimeError("a launcher that does not take these arguments")
        self.log.append(("direct", a))


class _Kernel:
    """A stand-in JITFunction: params (X, n, s, BLOCK, FLAG constexprs); kernel[grid](...) records a plain
    launch and returns one compiled kernel per (alignment of X, n == 1, constexprs), as Triton would."""

    def __init__(self):
        p = lambda name, c: SimpleNamespace(name=name, is_constexpr=c, annotation="constexpr" if c else "",  # noqa: E731
                                            do_not_specialize=False, do_not_specialize_on_alignment=False)
        self.params = [p("X", False), p("n", False), p("s", False), p("BLOCK", True), p("FLAG", True)]
        self.pre_run_hooks, self.log, self.compiled = [], [], {}

    def __getitem__(self, grid):
        def plain(*args, **meta):
            self.log.append(("plain", grid, args, meta))
            spec = (args[0].data_ptr() % 16 == 0, args[1] == 1, (args + (meta.get("BLOCK"),))[3], meta["FLAG"])
            return self.compiled.setdefault(spec, _Compiled(self.log))
        return plain


@pytest.fixture
def fake_gpu(monkeypatch):
    """The direct path set up as on a GPU, for the stand-in kernel (tensors may be on the CPU)."""
    from triton import knobs

    monkeypatch.setattr(fl, "_ready", True)
    monkeypatch.setattr(fl, "_why_not", None)
    monkeypatch.setattr(fl, "_jit_class", _Kernel)
    monkeypatch.setattr(fl, "_cuda_only", False)
    rt = SimpleNamespace(launch_enter_hook=knobs.HookChain(), launch_exit_hook=knobs.HookChain(reversed=True))
    monkeypatch.setattr(fl, "_rt", rt)
    monkeypatch.setattr(fl, "_hook_chain", knobs.HookChain)
    monkeypatch.setattr(fl, "_knobs", SimpleNamespace(runtime=SimpleNamespace(debug=False)))
    monkeypatch.setattr(fl, "_knob_get", lambda k: (k.runtime.debug,))
    monkeypatch.setattr(fl, "_get_device", lambda: 0)
    monkeypatch.setattr(fl, "_get_stream", lambda dev: 77)
    monkeypatch.setattr(fl, "_direct", True)
    fl.clear()
    yield rt
    fl.clear()


def test_direct_path_reuses_only_a_matching_specialization(fake_gpu):
    k, buf = _Kernel(), torch.zeros(64, dtype=torch.bfloat16)
    meta = dict(BLOCK=32, FLAG=True, num_warps=4)
    kinds = lambda: [e[0] for e in k.log]  # noqa: E731
    fl.launch(k, (3,), (buf, 16, 0.5), meta)
    fl.launch(k, (3,), (buf, 16, 0.5), meta)
    assert kinds() == ["plain", "direct"]
    # the launcher gets what JITFunction.run passes: grid, stream, function, metadata, no hooks, every parameter
    assert k.log[1][1] == (3, 1, 1, 77, 1234, (4, 1, 0), None, None, None, buf.data_ptr(), 16, 0.5, 32, True)
    fl.launch(k, (3,), (buf[1:], 16, 0.5), meta)  # unaligned: a new specialization, compiled by the plain path
    fl.launch(k, (3,), (buf, 1, 0.5), meta)  # n == 1 is a constexpr to Triton
    fl.launch(k, (3,), (buf, 16, 0.5), dict(meta, BLOCK=64))
    assert kinds()[2:] == ["plain", "plain", "plain"]
    fl.launch(k, (3,), (buf[1:], 16, 0.5), meta)
    assert k.log[-1][0] == "direct" and k.log[-1][1][9] == buf[1:].data_ptr()
    fake_gpu.launch_enter_hook.add(lambda md: None)  # a profiler's hook: Triton's own path, with it
    fl.launch(k, (3,), (buf, 16, 0.5), meta)
    assert k.log[-1][0] == "plain"


def test_a_parameter_triton_does_not_specialize_is_keyed_all_the_same(fake_gpu):
    """A do_not_specialize positional (the Gluon kernels' ``zero``) is launched directly; the key still tells
    its values apart where Triton's would not (0 and 16 both 16-aligned: one entry; 1 and 3: others), so a
    direct launch never reuses a kernel for an argument Triton compiled apart."""
    k, buf = _Kernel(), torch.zeros(64, dtype=torch.bfloat16)
    k.params[1].do_not_specialize = k.params[1].do_not_specialize_on_alignment = True
    meta = dict(BLOCK=32, FLAG=True)
    for n in (0, 0, 16, 1, 1):
        fl.launch(k, (3,), (buf, n, 0.5), meta)
    assert [e[0] for e in k.log] == ["plain", "direct", "direct", "plain", "direct"]
    assert k.log[2][1][10] == 16 and k.log[4][1][10] == 1  # (each launch passes its own value)


def test_descriptor_answers_are_remembered_by_what_they_are_made_of(monkeypatch):
    """launch_key gives a TMA descriptor Triton's own answer, remembered by dtype, box and layout: another
    tensor with those is one entry, another box or dtype another (Triton's host and Gluon descriptors)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from kernels.methods.flash import gluon_common

    monkeypatch.setattr(fl, "_desc_classes", fl.descriptor_classes())
    monkeypatch.setattr(fl, "_desc_specs", {})
    x, y = torch.zeros(4, 64, 64, dtype=torch.bfloat16), torch.zeros(4, 64, 64, dtype=torch.float16)
    host = lambda t, box: TensorDescriptor(t, list(t.shape), list(t.stride()), box)  # noqa: E731
    descs = [host(x, [1, 64, 64]), host(x, [1, 32, 64]), host(y, [1, 64, 64]), host(x.clone(), [1, 64, 64])]
    if gluon_common.GLUON_ERROR is None:
        descs += [gluon_common.descriptor(x.view(1, 4, 64, 64), 64), gluon_common.descriptor(x.view(1, 4, 64, 64), 32)]
    got = [fl.launch_key((d,), {}, 0)[0][3][0] for d in descs]
    assert got == [fl._spec(fl._backend, d, False, True, True) for d in descs]
    assert len(set(got[:3])) == 3 and got[3] == got[0]
    assert len(fl._desc_specs) == len(descs) - 1  # (the clone's came from the first's entry)


def test_switch_and_surprises_take_the_plain_path(fake_gpu, monkeypatch):
    k, buf = _Kernel(), torch.zeros(64)
    meta = dict(BLOCK=32, FLAG=False)
    for _ in range(2):
        fl.launch(k, (2, 2), (buf, 16, 0.5), meta)
    assert [e[0] for e in k.log] == ["plain", "direct"] and k.log[1][1][:3] == (2, 2, 1)
    monkeypatch.setenv("HARNESS_TRITON_DIRECT", "0")
    fl.configure()
    assert not fl.direct_enabled()
    fl.launch(k, (2,), (buf, 16, 0.5), meta)
    monkeypatch.delenv("HARNESS_TRITON_DIRECT")
    fl.configure()
    assert fl.direct_enabled() and k.log[-1][0] == "plain"
    fl.launch(k, lambda meta: (2,), (buf, 16, 0.5), meta)  # a callable grid
    assert k.log[-1][0] == "plain"
    # positional constexprs: never direct
    k2 = _Kernel()
    for _ in range(2):
        fl.launch(k2, (1,), (buf, 16, 0.5, 32), dict(FLAG=False))
    assert [e[0] for e in k2.log] == ["plain", "plain"]
    # a launcher that raises: the plain path for this launch and from then on
    for c in k.compiled.values():
        c.fail = True
    fl.launch(k, (2,), (buf, 16, 0.5), meta)
    fl.launch(k, (2,), (buf, 16, 0.5), meta)
    assert [e[0] for e in k.log[-2:]] == ["plain", "plain"]


def test_prepared_launch_is_the_direct_launch_with_new_tensors(fake_gpu, monkeypatch):
    """fastlaunch.prepare: after a launch, the same launch for other tensors without the key; where the
    entry does not apply now (other alignment, a hook, the direct path off, a launcher that raised) the
    tensors go through launch; on another current device nothing is launched."""
    k, buf, other = _Kernel(), torch.zeros(64, dtype=torch.bfloat16), torch.zeros(64, dtype=torch.bfloat16)
    meta = dict(BLOCK=32, FLAG=True, num_warps=4)
    assert fl.prepare(k, (3,), (buf, 16, 0.5), meta) is None  # nothing launched with this key yet
    fl.launch(k, (3,), (buf, 16, 0.5), meta)
    prep = fl.prepare(k, (3,), (buf, 16, 0.5), meta)
    assert prep(other) is True
    assert k.log[-1] == ("direct", (3, 1, 1, 77, 1234, (4, 1, 0), None, None, None, other.data_ptr(), 16, 0.5, 32,
                                    True))
    assert prep(buf[1:]) is True  # 2 bytes off: launch's own choice, a plain launch of a new specialization
    assert k.log[-1][0] == "plain" and k.log[-1][2][0].data_ptr() == buf[1:].data_ptr()
    assert k.log[-1][2][1:] == (16, 0.5)
    fl.configure(False)
    prep(other)
    assert k.log[-1][0] == "plain"
    fl.configure(True)
    n = len(k.log)
    monkeypatch.setattr(fl, "_get_device", lambda: 1)
    assert prep(other) is False and len(k.log) == n  # another current device: the caller's general path
    monkeypatch.setattr(fl, "_get_device", lambda: 0)
    fake_gpu.launch_enter_hook.add(lambda md: None)
    prep(other)
    assert k.log[-1][0] == "plain"
    fake_gpu.launch_enter_hook = fl._hook_chain()
    for c in k.compiled.values():
        c.fail = True
    assert prep(other) is True and k.log[-1][0] == "plain"  # the launcher raised: through launch, which falls back
    for c in k.compiled.values():
        c.fail = False
    prep(other)
    assert k.log[-1][0] == "plain"  # (not used again)


def test_prepared_launch_rechecks_what_its_key_does_not_fix(fake_gpu, monkeypatch):
    """A launch prepared with an unaligned tensor goes direct only for tensors of that alignment; a knob
    of the key changed, a pre-run hook, or the kernel sent the plain way by launch: through launch, on
    the device it was prepared for."""
    k, buf = _Kernel(), torch.zeros(64, dtype=torch.bfloat16)
    meta = dict(BLOCK=32, FLAG=True)
    fl.launch(k, (2,), (buf[1:], 16, 0.5), meta)
    prep = fl.prepare(k, (2,), (buf[1:], 16, 0.5), meta)
    prep(buf[9:])  # (also 2 bytes off a 16-byte boundary)
    assert k.log[-1][0] == "direct" and k.log[-1][1][9] == buf[9:].data_ptr()
    prep(buf)  # aligned: not this specialization
    assert k.log[-1][0] == "plain" and k.log[-1][2][0].data_ptr() == buf.data_ptr()
    devices = []
    real = fl.launch
    monkeypatch.setattr(fl, "launch", lambda *a: (devices.append(a[4]), real(*a))[1])
    monkeypatch.setattr(fl, "_knobs", SimpleNamespace(runtime=SimpleNamespace(debug=True)))  # TRITON_DEBUG turned on
    prep(buf[9:])
    assert k.log[-1][0] == "plain" and devices == [0]  # (debug is in the key: a new specialization)
    monkeypatch.setattr(fl, "_knobs", SimpleNamespace(runtime=SimpleNamespace(debug=False)))
    prep(buf[9:])
    assert k.log[-1][0] == "direct"
    k.pre_run_hooks.append(lambda *a, **kw: None)
    prep(buf[9:])
    assert k.log[-1][0] == "plain"
    k.pre_run_hooks.clear()
    fl._kernels[id(k)] = (k, None)  # what launch does after a launcher raised: this kernel goes the plain way
    prep(buf[9:])
    assert k.log[-1][0] == "plain"


def test_launches_are_counted_by_the_path_they_took(fake_gpu, monkeypatch):
    """counts(): each launch once, under the path it really took (what a benchmark reports of its timed
    calls), including the reason a launch went through kernel[grid]."""
    k, buf = _Kernel(), torch.zeros(64, dtype=torch.bfloat16)
    meta = dict(BLOCK=32, FLAG=True)
    fl.reset_counts()
    fl.launch(k, (2,), (buf, 16, 0.5), meta)
    fl.launch(k, (2,), (buf, 16, 0.5), meta)
    prep = fl.prepare(k, (2,), (buf, 16, 0.5), meta)
    prep(buf)
    prep(buf)
    assert fl.counts() == {fl.PLAIN_NEW: 1, "direct": 1, "prepared": 2}
    assert [e[0] for e in k.log] == ["plain", "direct", "direct", "direct"]
    assert fl.describe_counts(fl.counts()) == f"prepared 2, direct 1, {fl.PLAIN_NEW} 1"
    fl.reset_counts()
    fake_gpu.launch_enter_hook.add(lambda md: None)
    prep(buf)  # (a hook: the prepared launch hands the tensors to launch, which counts its own path)
    fake_gpu.launch_enter_hook = fl._hook_chain()
    for c in k.compiled.values():
        c.fail = True
    fl.launch(k, (2,), (buf, 16, 0.5), meta)
    fl.launch(k, (2,), (buf, 16, 0.5), meta)  # (sent the plain way by the failure)
    fl.configure(False)
    fl.launch(k, (2,), (buf, 16, 0.5), meta)
    fl.configure(True)
    assert fl.counts() == {fl.PLAIN_HOOKS: 1, fl.PLAIN_RAISED: 1, fl.PLAIN_ASIDE: 1, fl.PLAIN_OFF: 1}
    assert [e[0] for e in k.log[4:]] == ["plain"] * 4
    fl.reset_counts()
    assert fl.counts() == {} and fl.describe_counts(fl.counts()) == "-"


def test_prepared_slots_take_tensors_and_descriptors_anywhere(fake_gpu, monkeypatch):
    """A launch whose tensors do not all lead, or that takes TMA descriptors (the Gluon kernels'), is
    prepared by position: a tensor goes as its address (its alignment rechecked), a descriptor as itself;
    anything else through launch, with the objects in their places."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    monkeypatch.setattr(fl, "_desc_classes", fl.descriptor_classes())
    k, buf, other = _Kernel(), torch.zeros(64, dtype=torch.bfloat16), torch.zeros(64, dtype=torch.bfloat16)
    meta = dict(BLOCK=32, FLAG=False)
    fl.launch(k, (2,), (buf, 16, buf), meta)  # a tensor after a scalar
    prep = fl.prepare(k, (2,), (buf, 16, buf), meta)
    assert isinstance(prep, fl.PreparedSlots)
    fl.reset_counts()
    assert prep(other, buf) is True
    assert k.log[-1] == ("direct", (2, 1, 1, 77, 1234, (4, 1, 0), None, None, None, other.data_ptr(), 16,
                                    buf.data_ptr(), 32, False))
    prep(other, buf[1:])  # the second tensor 2 bytes off: not this specialization, through launch
    assert k.log[-1][0] == "plain" and k.log[-1][2][2].data_ptr() == buf[1:].data_ptr() and k.log[-1][2][1] == 16
    assert fl.counts() == {"prepared": 1, fl.PLAIN_NEW: 1}
    desc = lambda t: TensorDescriptor(t.view(8, 8), [8, 8], [8, 1], [8, 8])  # noqa: E731
    fl.launch(k, (2,), (buf, 16, desc(buf)), meta)
    prep = fl.prepare(k, (2,), (buf, 16, desc(buf)), meta)
    d = desc(other)
    assert prep(other, d) is True
    assert k.log[-1][0] == "direct" and k.log[-1][1][9:12] == (other.data_ptr(), 16, d)
    fl.configure(False)
    prep(buf, d)  # the direct path off: kernel[grid] with the objects in their places
    fl.configure(True)
    assert k.log[-1][0] == "plain" and k.log[-1][2][0] is buf and k.log[-1][2][1:] == (16, d)
    n = len(k.log)
    monkeypatch.setattr(fl, "_get_device", lambda: 1)
    assert prep(other, d) is False and len(k.log) == n


def test_prepare_declines_what_it_cannot_prepare(fake_gpu):
    k, buf = _Kernel(), torch.zeros(64)
    meta = dict(BLOCK=32, FLAG=False)
    fl.launch(k, (2,), (buf, 16, None), meta)  # neither a tensor, a descriptor, nor a number
    assert fl.prepare(k, (2,), (buf, 16, None), meta) is None
    fl.launch(k, (2,), (buf, 16, 0.5), meta)
    assert fl.prepare(k, lambda m: (2,), (buf, 16, 0.5), meta) is None  # a callable grid
    assert fl.prepare(k, (2,), (buf, 16, 0.5), dict(meta, FLAG=True)) is None  # another key
    fl.configure(False)
    assert fl.prepare(k, (2,), (buf, 16, 0.5), meta) is None
    fl.configure(True)
    assert fl.prepare(k, (2,), (buf, 16, 0.5), meta) is not None


def test_interpreter_falls_back_to_identical_results(monkeypatch, seeded):
    """Under Triton's interpreter (or wherever Triton's internals differ) the direct path stands aside:
    launches are the plain ones, with or without the switch."""
    if DEVICE == "cuda":
        pytest.skip("the interpreter runs on a CPU")
    assert fl.unsupported_reason() is not None
    for n, causal in ((64, True), (300, False)):
        x = torch.randn(6, n, generator=seeded)
        dy = torch.randn(6, n, generator=seeded)
        outs = []
        for direct in (True, False):
            fl.configure(direct)
            y = launch_fwd(x, 0.5, causal)
            outs.append((y, launch_bwd(y, dy, 0.5, causal)))
        fl.configure()
        assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert all(v[1] is None for v in fl._kernels.values())  # no direct entry was ever made


# (rows shape, dtype, causal): the tile path, the fill path (causal forward), hybrid + persistent (32768),
# hybrid + ring (65536), split (fp32 rows past 65536, causal too), long (rows past 128 split chunks); an
# unaligned row stride turns the Gluon paths away (persistent / long instead)
_GPU_CASES = [((64, 128), torch.bfloat16, False), ((33, 1000), torch.float32, False),
              ((2, 256, 256), torch.bfloat16, True), ((2, 1024, 1024), torch.float16, True),
              ((8, 32768), torch.bfloat16, False), ((4, 65536), torch.bfloat16, False),
              ((3, 70000), torch.float32, False), ((1, 4, 70000), torch.float32, True),
              ((2, 1_100_000), torch.float32, False)]


def _inputs(shape, dtype, view, gen):
    n = shape[-1]
    pad = 1 if view == "unaligned-stride" else 0
    x, dy = (torch.randn(*shape[:-1], n + pad, generator=gen).to(DEVICE, dtype)[..., :n] for _ in range(2))
    return x, dy


def _both_ways(x, dy, causal, calls=3):
    """{direct: [(y, dx) per call]}: each way from empty direct caches (the first call compiles or finds the
    kernel through kernel[grid], the next are direct where the direct path is on: the second and third
    through the launch kept prepared for that shape)."""
    out = {}
    for direct in (False, True):
        fl.configure(direct)
        fl.clear()
        out[direct] = []
        for _ in range(calls):
            y = launch_fwd(x, 0.5, causal)
            out[direct].append((y, launch_bwd(y, dy, 0.5, causal)))
        torch.cuda.synchronize()
    fl.configure()
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("view", ["contiguous", "unaligned-stride"])
@pytest.mark.parametrize("shape,dtype,causal", _GPU_CASES, ids=lambda v: str(v).replace("torch.", ""))
def test_direct_launches_match_plain_ones_on_the_gpu(shape, dtype, causal, view, seeded):
    """Every softmax path launched directly, and through its prepared launch, gives bit-for-bit the plain
    launch's outputs, with the same strides."""
    from kernels.methods.triton.softmax import launch as tl_launch

    assert fl.unsupported_reason() is None, fl.unsupported_reason()  # the Triton this was written for
    x, dy = _inputs(shape, dtype, view, seeded)
    out = _both_ways(x, dy, causal)
    assert any(e[1] for e in fl._kernels.values()), "no direct entry was made"
    if view == "contiguous" and not tp.cached_plan(shape[-1], x.element_size(), causal=causal).split:
        assert tl_launch._FWD_SITES, "no prepared launch was kept"
    for y, dx in out[True]:
        for got, want in ((y, out[False][0][0]), (dx, out[False][0][1])):
            assert torch.equal(got, want) and got.stride() == want.stride()


@pytest.mark.gpu
@pytest.mark.parametrize("shape,dtype", [((64, 128), torch.bfloat16), ((33, 1000), torch.float32),
                                         ((3, 70000), torch.float32), ((8, 32768), torch.bfloat16)])
def test_a_differently_aligned_tensor_gets_its_own_specialization(shape, dtype, seeded):
    """After direct launches with 16-byte aligned rows, rows at an address 2 or 4 bytes off are not
    launched with the aligned specialization: a new entry, and the plain launch's outputs."""
    numel = torch.Size(shape).numel()
    flat, dflat = (torch.randn(numel + 8, generator=seeded).to(DEVICE, dtype) for _ in range(2))
    fl.clear()
    aligned = flat[:numel].view(shape), dflat[:numel].view(shape)
    for _ in range(2):
        y = launch_fwd(aligned[0], 0.5, False)
        launch_bwd(y, aligned[1], 0.5, False)
    before = sum(len(e[1] or ()) for e in fl._kernels.values())
    off = flat[1:numel + 1].view(shape), dflat[1:numel + 1].view(shape)
    assert off[0].data_ptr() % 16
    got = _both_ways(*off, False, calls=1)  # (clears, so compare against the plain way directly)
    fl.clear()
    for _ in range(2):
        y = launch_fwd(aligned[0], 0.5, False)
        launch_bwd(y, aligned[1], 0.5, False)
    y_off = launch_fwd(off[0], 0.5, False)
    dx_off = launch_bwd(y_off, off[1], 0.5, False)
    after = sum(len(e[1] or ()) for e in fl._kernels.values())
    assert after > before
    assert torch.equal(y_off, got[False][0][0]) and torch.equal(dx_off, got[False][0][1])
    assert torch.equal(got[True][0][0], got[False][0][0])


def test_cdiv_is_tritons_without_the_constexpr_call():
    """The grids' host-side ceil division gives what triton.cdiv gives (0, exact, one past, large)."""
    import triton

    for a in (0, 1, 15, 16, 17, 1000, 1024, 2**31 + 5):
        for b in (1, 16, 64, 128):
            assert fl.cdiv(a, b) == triton.cdiv(a, b)


def test_importing_the_runtime_registers_no_method():
    """The shared runtime (kernels.runtime and each of its modules) is imported in a fresh process without
    filling the registry: no `triton` method, no method module imported (the bare `kernels.methods` package,
which the registry imports to find them, holds none)."""
    import subprocess
    import sys

    code = ("import importlib, pkgutil, sys\nimport kernels.runtime as rt\nimport kernels.registry as reg\n"
            "for m in pkgutil.iter_modules(rt.__path__):\n    importlib.import_module(f'kernels.runtime.{m.name}')\n"
            "print(sorted(getattr(reg, '_REGISTRY', {})), sorted(n for n in sys.modules if n.startswith('kernels.methods.')))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "[] []", run.stdout
