"""Direct launches of compiled Triton kernels: :func:`launch` is ``kernel[grid](*args, **meta)`` without
``JITFunction.run``'s per-call Python (binding, the cache-key string, the launch-metadata dict, the two
empty launch-hook chains the launcher calls back, the launcher's pointer queries).

Why it is exact. The first call with a given key goes through ``kernel[grid]``, which compiles (or finds)
the kernel and returns the ``CompiledKernel`` it launched; later calls with that key call its launcher
with what ``JITFunction.run`` passes: grid, the current stream, ``function``, ``packed_metadata``, no
launch metadata or hooks (only when none are installed), every parameter in signature order (the
launcher skips constexprs). The key refines Triton's own (``compute_cache_key``): the current device;
the meta keywords (constexpr values; options: num_warps, num_stages, maxnreg); the knobs ``run`` adds
to the options (TRITON_DEBUG, the instrumentation mode); per positional argument what Triton 3.6's
``native_specialize_impl`` makes of it: a tensor's dtype and whether its address is 16-byte aligned
(the same test, here; the address goes to the launcher as an int, so it skips ``data_ptr()`` and
``cuPointerGetAttribute``), anything else's own result from that function (ints: i32/i64/u64, divisible
by 16, equal to 1, which makes a constexpr; floats; bools; a TMA descriptor's type, remembered by its
dtype, box and layout). A parameter Triton does not specialize (``do_not_specialize``) is keyed as if it
did: finer than Triton's key, never coarser.

Prepared launches (:func:`prepare`, :class:`Prepared`): where a launch site knows that everything but
its tensors is fixed by a key of its own (shapes, strides, dtypes, scalars), it keeps the direct entry
with the other arguments bound and calls it with the new tensors: the key, the argument tuple and the
meta dict are not rebuilt. It checks per call what the key cannot fix (the switch, the hooks, the
knobs, the current device, each tensor's alignment) and hands anything else to :func:`launch`.
:class:`PreparedSlots` does the same for a launch whose tensors do not all lead or that takes TMA
descriptors: those by position, a descriptor passed as itself (the launcher encodes it from its tensor).

Every launch is counted by the path it took (:func:`counts`, :func:`reset_counts`): ``prepared``, ``direct``,
or ``plain: <why>``, so a benchmark can show that its timed calls launched as it believes.

Where it stands aside (the plain ``kernel[grid]``, silently correct): ``TRITON_INTERPRET=1``;
``HARNESS_TRITON_DIRECT=0`` (read at import; :func:`configure` re-reads it); a ``JITFunction.run`` whose
source is not one checked against this module (Triton 3.6.0, 3.9.0: :mod:`.run_source`;
``HARNESS_TRITON_DIRECT=force`` takes another that still has every reproduced line and no unknown knob read); pre-run hooks, annotated
parameters, constexprs passed positionally; installed launch hooks (a profiler); a
callable grid; a tensor not on the GPU; an asynchronous compile; a full cache; any exception of the
direct call. Not reproduced: ``run``'s check that globals a kernel read have not changed (it only raises).
"""

from __future__ import annotations

import inspect
import math
import operator
import os
from collections import Counter
from typing import Any, Optional

import torch

from kernels.runtime.availability import interpreter_enabled, triton
from kernels.runtime.run_source import check_run_source

_Tensor = torch.Tensor
_MAX_ENTRIES = 1024  # direct entries per kernel (a key that never repeats must not grow memory)

try:  # Triton's own argument specialization (C++), for every argument but tensors
    from triton.backends import BaseBackend as _backend
    from triton.runtime.jit import native_specialize_impl as _spec
except Exception:  # pragma: no cover - no Triton, or one without it: the plain path only
    _spec = _backend = None

_FLOAT_SPEC = ("fp32", None)  # native_specialize_impl's answer for every Python float
_int_specs: dict = {}  # int (exactly int: True == 1 but is a bool) -> native_specialize_impl's answer
#: TMA descriptor classes (set up with the rest): their answer is a type string of the base's dtype, the box
#: and the shared layout, not of the tensor, so it is remembered by those (about 7 us a descriptor saved)
_desc_classes: frozenset = frozenset()
_desc_specs: dict = {}  # (class, dtype, box, layout, rank, padding, tf32 rounding) -> the answer
_direct = os.environ.get("HARNESS_TRITON_DIRECT", "1") != "0"
_force = os.environ.get("HARNESS_TRITON_DIRECT") == "force"  # also an unknown run source that passes the checks
_cuda_only = True  # tensors must be on the GPU (tests of the logic on the CPU turn it off)
_ready = False  # set by _setup, once: why not (None: available), then what a launch reads
_why_not: Optional[str] = "not set up"
_jit_class: Any = None  # triton's JITFunction (Gluon's is a subclass)
_rt: Any = None  # triton.knobs.runtime (the launch hooks)
_hook_chain: Any = None
_knobs: Any = None  # triton.knobs
_knob_get: Any = lambda knobs: ()  # noqa: E731 (the knob values run adds to the options, in one call)
_none_reads: tuple = ()  # (knobs namespace, name) that must be None
_get_device: Any = None
_get_stream: Any = None
_kernels: dict = {}  # id(kernel) -> (kernel, {key: (launcher, function, packed metadata, constexpr tail)} or None)
_layouts: dict = {}  # (id(kernel), meta keys, positional count) -> constexpr names after the positionals, or None
_counts: Counter = Counter()  # launches by path since reset_counts (see counts)
#: why a launch went through ``kernel[grid]``, as counts names it
PLAIN_OFF, PLAIN_ASIDE, PLAIN_HOOKS, PLAIN_NEW, PLAIN_RAISED = (
    "plain: direct path off", "plain: kernel set aside", "plain: launch hook or host tensor",
    "plain: first launch of its key", "plain: launcher raised")


def counts() -> dict:
    """Launches since :func:`reset_counts` by the path each took: ``prepared`` (a :class:`Prepared`'s direct
    call), ``direct`` (:func:`launch` found the compiled kernel of its key), or ``kernel[grid]`` for one of
    these reasons: the direct path switched off (``PLAIN_OFF``); the kernel stands aside (not a JITFunction
    this module takes, Triton's interpreter, a pre-run hook, a callable grid, or sent the plain way after its
    launcher raised: ``PLAIN_ASIDE``); a launch hook installed or a tensor not on the GPU (``PLAIN_HOOKS``);
    the first launch of its key, which compiles or finds the kernel (``PLAIN_NEW``); the direct call raised
    (``PLAIN_RAISED``)."""
    return dict(_counts)


def reset_counts() -> None:
    _counts.clear()


def describe_counts(c: dict) -> str:
    """counts() as one short line, e.g. "prepared 3" or "direct 1, plain: first launch of its key 2" ("-": none)."""
    return ", ".join(f"{k} {n}" for k, n in sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))) or "-"


def configure(direct: Optional[bool] = None) -> None:
    """Turn the direct path on or off (None: from ``HARNESS_TRITON_DIRECT``, on unless it is ``0``)."""
    global _direct, _force
    _direct = os.environ.get("HARNESS_TRITON_DIRECT", "1") != "0" if direct is None else direct
    _force = os.environ.get("HARNESS_TRITON_DIRECT") == "force"


def direct_enabled() -> bool:
    return _direct


def _setup() -> None:
    """Once: whether this Triton's internals are those coded for, and the callables a launch uses."""
    global _ready, _why_not, _rt, _knobs, _knob_get, _none_reads, _hook_chain, _get_device, _get_stream, _jit_class
    global _desc_classes
    _ready = True
    try:
        if triton is None or _spec is None or interpreter_enabled():
            raise RuntimeError("Triton's interpreter (or no Triton)")
        # Triton's runtime internals: only for a compiled (non-interpreted) Triton, checked just above
        from triton import knobs
        from triton.runtime import jit  # (as knobs, above)
        from triton.runtime.driver import driver  # (as knobs, above)

        why, knob_names, none_names = check_run_source(inspect.getsource(jit.JITFunction.run), _force)
        if why:
            raise RuntimeError(why)
        ns = {"runtime": knobs.runtime, "compilation": knobs.compilation}
        if knob_names:
            _knob_get = operator.attrgetter(*(f"{a}.{b}" for a, b in knob_names))
            if len(knob_names) == 1:
                _knob_get = (lambda g: lambda k: (g(k),))(_knob_get)
        _knob_get(knobs)
        _knobs = knobs
        _none_reads = tuple((ns[a], b) for a, b in none_names)
        for obj, name in _none_reads:
            getattr(obj, name)
        _rt, _hook_chain = knobs.runtime, knobs.HookChain
        _rt.launch_enter_hook, _rt.launch_exit_hook  # noqa: B018 (they exist)
        _jit_class = jit.JITFunction
        _get_device, _get_stream = driver.active.get_current_device, driver.active.get_current_stream
        _desc_classes = descriptor_classes()
        _why_not = None
    except Exception as exc:  # any mismatch: the plain path, always
        _why_not = f"{type(exc).__name__}: {exc}"


def descriptor_classes() -> frozenset:
    """The TMA descriptor classes of this Triton whose arguments launch_key remembers by what they are made
    of: Triton's host descriptor and Gluon's (where each imports)."""
    found = []
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor  # (at set-up, on a GPU: as knobs above)
        found.append(TensorDescriptor)
    except Exception:  # pragma: no cover - a Triton without host descriptors
        pass
    try:
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor  # (as above)
        found.append(GluonDescriptor)
    except Exception:  # pragma: no cover - a Triton without Gluon
        pass
    return frozenset(found)


def unsupported_reason() -> Optional[str]:
    """Why this process launches through ``kernel[grid]`` only (None: the direct path is available)."""
    if not _ready:
        _setup()
    return _why_not


def launch_key(args: tuple, meta: dict, device: int, require_cuda: bool = False) -> Optional[tuple[tuple, list]]:
    """(the key a compiled kernel is reused for, the values the launcher gets for the positionals): the
    device, the meta keywords, the knob reads, and per positional a tensor's (dtype, address 16-byte
    aligned) and address, any other argument's ``native_specialize_impl`` result (remembered per int
    value; a float's is always ("fp32", None)) and itself. None where a tensor is not on the GPU
    (require_cuda)."""
    spec, vals = [], []
    for a in args:
        c = a.__class__
        if c is _Tensor:
            if require_cuda and not a.is_cuda:
                return None
            p = a.data_ptr()
            spec.append((a.dtype, not p & 15))
            vals.append(p)
            continue
        if c is int:
            s = _int_specs.get(a)
            if s is None:
                s = _spec(_backend, a, False, True, True)
                if len(_int_specs) < 65536:
                    _int_specs[a] = s
        elif c is float:
            s = _FLOAT_SPEC
        elif c in _desc_classes:
            s = _descriptor_spec(a, c)
        else:
            s = _spec(_backend, a, False, True, True)
        spec.append(s)
        vals.append(a)
    return (device, tuple(meta.items()), _knob_get(_knobs), tuple(spec)), vals


def _descriptor_spec(a, c) -> tuple:
    """A TMA descriptor's ``native_specialize_impl`` answer, remembered by what it is made of (the key also
    holds the rank, padding and rounding, which the answer does not show: finer is safe)."""
    try:
        k = (c, a.base.dtype, tuple(a.block_shape), getattr(a, "layout", None), len(a.shape),
             getattr(a, "padding", None), getattr(a, "round_f32_to_tf32", None))
        s = _desc_specs.get(k)
    except (TypeError, AttributeError):  # (a layout that does not hash; a descriptor made otherwise)
        return _spec(_backend, a, False, True, True)
    if s is None:
        s = _spec(_backend, a, False, True, True)
        if len(_desc_specs) < 4096:
            _desc_specs[k] = s
    return s


def _layout(kernel, args: tuple, meta: dict) -> Optional[tuple]:
    """The constexpr parameter names after the positional arguments (None: not a signature this module
    takes: positionals must be the plain, unannotated parameters, constexprs keywords). A positional
    Triton does not specialize (``do_not_specialize``, ``..._on_alignment``) is taken: the key specializes
    it all the same, so it is finer than Triton's (more entries for one compiled kernel, never one
    compiled kernel for arguments Triton would compile apart)."""
    lk = (id(kernel), tuple(meta), len(args))
    if lk not in _layouts:
        params, n = kernel.params, len(args)
        ok = not kernel.pre_run_hooks and all(
            not p.is_constexpr and not p.annotation for p in params[:n]
        ) and all(p.is_constexpr and p.name in meta for p in params[n:])
        _layouts[lk] = tuple(p.name for p in params[n:]) if ok else None
    return _layouts[lk]


def _hooks_idle() -> bool:
    """No launch hook installed (Triton's default: empty hook chains) and no hook run must see unset."""
    h, x = _rt.launch_enter_hook, _rt.launch_exit_hook
    if (h is not None and (h.__class__ is not _hook_chain or h.calls)) or (
            x is not None and (x.__class__ is not _hook_chain or x.calls)):
        return False
    for o, n in _none_reads:
        if getattr(o, n) is not None:
            return False
    return True


def _entries(kernel) -> Optional[dict]:
    """This kernel's direct entries (None: it always takes the plain path). Kept by id: a JITFunction
    hashes its source hash under a lock; the kernel is kept alive with its entries."""
    ok = unsupported_reason() is None and isinstance(kernel, _jit_class)
    _kernels[id(kernel)] = (kernel, {} if ok else None)
    return _kernels[id(kernel)][1]


def launch(kernel, grid: tuple, args: tuple, meta: dict, device: Optional[int] = None) -> None:
    """``kernel[grid](*args, **meta)``, directly where a compiled kernel for this key was launched before.
    device: the current CUDA device index where the caller knows it (saves asking)."""
    if not _direct:
        _counts[PLAIN_OFF] += 1
        kernel[grid](*args, **meta)
        return
    ke = _kernels.get(id(kernel))
    entries = _entries(kernel) if ke is None or ke[0] is not kernel else ke[1]
    if entries is None or kernel.pre_run_hooks or grid.__class__ is not tuple:
        _counts[PLAIN_ASIDE] += 1
        kernel[grid](*args, **meta)
        return
    dev = _get_device() if device is None else device
    kv = launch_key(args, meta, dev, _cuda_only)
    if kv is None or not _hooks_idle():
        _counts[PLAIN_HOOKS] += 1
        kernel[grid](*args, **meta)
        return
    key = kv[0]
    e = entries.get(key)
    if e is not None:
        try:
            n = len(grid)
            e[0](grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, _get_stream(dev), e[1], e[2],
                 None, None, None, *kv[1], *e[3])
            _counts["direct"] += 1
            return
        except Exception:  # a surprise: this kernel goes the plain way from now on
            _kernels[id(kernel)] = (kernel, None)
            _counts[PLAIN_RAISED] += 1
            kernel[grid](*args, **meta)
            return
    _counts[PLAIN_NEW] += 1
    compiled = kernel[grid](*args, **meta)
    names = _layout(kernel, args, meta)
    if names is None or compiled is None or hasattr(compiled, "result") or len(entries) >= _MAX_ENTRIES:
        return
    try:
        entries[key] = (compiled.run, compiled.function, compiled.packed_metadata, tuple(meta[k] for k in names))
    except Exception:
        _kernels[id(kernel)] = (kernel, None)


class Prepared:
    """One launch whose only changing arguments are its tensors (the leading positionals): what
    :func:`launch` does for a later call with the same key, the key not recomputed. ``prepared(*tensors)``
    launches the kernel on them with the other arguments it was prepared with and returns True: directly,
    or through :func:`launch` (which then decides as always) where the direct entry does not apply now:
    the direct path switched off, a launch hook or pre-run hook installed, a knob of the key changed, a
    tensor whose 16-byte alignment is not the key's, a launcher that raised (from then on), or the
    kernel sent the plain way (or its entries cleared) by :func:`launch`. Tensors' dtypes are not
    checked: the caller's key must fix them. It returns False,
    launching nothing, when the current device is not the one it was prepared on (the caller's general
    path takes the call, under its device guard). Made by :func:`prepare`; the caller keys it by what
    fixes the rest of the key (shapes, strides, dtypes, scalars) and keeps it in a :class:`SiteCache`."""

    __slots__ = ("_run", "_grid", "_function", "_metadata", "_dev", "_knobs", "_aligned", "_all_aligned",
                 "_tail", "_live", "_plain", "_kid")

    def __init__(self, entry: tuple, plain: tuple, dev: int, knobs: tuple, aligned: tuple):
        kernel, grid, rest, meta = plain
        self._run, self._function, self._metadata = entry[0], entry[1], entry[2]
        n = len(grid)
        self._grid = (grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1)
        self._dev, self._knobs, self._aligned, self._tail = dev, knobs, aligned, rest + entry[3]
        self._all_aligned, self._live, self._plain, self._kid = all(aligned), True, plain, id(kernel)

    def __call__(self, *tensors: _Tensor) -> bool:
        if _get_device() != self._dev:
            return False
        ptrs = [t.data_ptr() for t in tensors]
        kernel = self._plain[0]
        if self._usable(kernel):
            if self._all_aligned:
                m = 0
                for p in ptrs:
                    m |= p
                ok = not m & 15
            else:
                ok = tuple(not p & 15 for p in ptrs) == self._aligned
            if ok and self._direct_call(ptrs):
                return True
        _, grid, rest, meta = self._plain
        launch(kernel, grid, (*tensors, *rest), meta, self._dev)
        return True

    def _usable(self, kernel) -> bool:
        """The direct entry applies now (launch may have sent this kernel the plain way since)."""
        ke = _kernels.get(self._kid)
        return (_direct and self._live and ke is not None and ke[0] is kernel and ke[1] is not None
                and not kernel.pre_run_hooks and _hooks_idle() and _knob_get(_knobs) == self._knobs)

    def _direct_call(self, positionals: list) -> bool:
        """The launcher called directly (True), or False after it raised (as in launch: nothing launched;
        this entry is not used again)."""
        g = self._grid
        try:
            self._run(g[0], g[1], g[2], _get_stream(self._dev), self._function, self._metadata, None, None, None,
                      *positionals, *self._tail)
        except Exception:
            self._live = False
            return False
        _counts["prepared"] += 1
        return True


class PreparedSlots(Prepared):
    """A :class:`Prepared` launch whose changing arguments are not only leading tensors: tensors and TMA
    descriptors at any positions (``slots``), the other positionals fixed. ``prepared(*changing)`` takes
    them in the order of their positions: a tensor goes to the launcher as its address (its 16-byte
    alignment checked against the key's), a descriptor as itself (the launcher encodes it from its tensor;
    its type, which the caller's key must fix, is its dtype, box and layout, as a tensor's dtype)."""

    __slots__ = ("_slots", "_kinds", "_template")

    def __init__(self, entry: tuple, plain: tuple, dev: int, knobs: tuple, aligned: tuple, slots: tuple,
                 kinds: tuple, template: list):
        super().__init__(entry, plain, dev, knobs, aligned)
        self._slots, self._kinds, self._template, self._tail = slots, kinds, template, entry[3]

    def __call__(self, *changing) -> bool:
        if _get_device() != self._dev:
            return False
        kernel = self._plain[0]
        if self._usable(kernel):
            vals, aligned = self._template.copy(), []
            for pos, is_tensor, x in zip(self._slots, self._kinds, changing):
                if is_tensor:
                    p = x.data_ptr()
                    vals[pos] = p
                    aligned.append(not p & 15)
                else:
                    vals[pos] = x
            if tuple(aligned) == self._aligned and self._direct_call(vals):
                return True
        args = self._template.copy()
        for pos, x in zip(self._slots, changing):
            args[pos] = x
        _, grid, _, meta = self._plain
        launch(kernel, grid, tuple(args), meta, self._dev)
        return True


class SiteCache(dict):
    """A launch site's :class:`Prepared` launches (or callables around them) by the caller's own key;
    emptied by :func:`clear` and whenever it reaches its size limit (keys that never repeat must not
    grow memory)."""

    def __init__(self, limit: int = _MAX_ENTRIES):
        super().__init__()
        self.limit = limit
        _site_caches.append(self)

    def put(self, key, value) -> None:
        if len(self) >= self.limit:
            self.clear()
        self[key] = value


_site_caches: list = []


def scalar_key(x: float):
    """A float as part of a site's key: x itself, but -0.0 apart from 0.0 (a kernel may pass the sign of
    a zero scale on to its outputs)."""
    return x if x else (x, math.copysign(1.0, x))


def prepare(kernel, grid: tuple, args: tuple, meta: dict, device: Optional[int] = None) -> Optional[Prepared]:
    """The direct launch :func:`launch` made for these arguments as a :class:`Prepared` that takes new
    tensors in place of theirs (all leading the positionals), or a :class:`PreparedSlots` that takes new
    tensors and TMA descriptors wherever they stand; None where there is none: the direct path off or
    standing aside for this kernel, no launch of this key made yet, a callable grid, or a positional other
    than a tensor, a descriptor, an int, float or bool."""
    if not _direct or grid.__class__ is not tuple:
        return None
    ke = _kernels.get(id(kernel))
    if ke is None or ke[0] is not kernel or not ke[1]:
        return None
    dev = _get_device() if device is None else device
    kv = launch_key(args, meta, dev, _cuda_only)
    e = None if kv is None else ke[1].get(kv[0])
    if e is None:
        return None
    n = 0
    while n < len(args) and args[n].__class__ is _Tensor:
        n += 1
    rest = tuple(args[n:])
    if all(a.__class__ in (int, float, bool) for a in rest):
        return Prepared(e, (kernel, grid, rest, dict(meta)), dev, kv[0][2], tuple(s[1] for s in kv[0][3][:n]))
    slots = tuple(i for i, a in enumerate(args) if a.__class__ is _Tensor or a.__class__ in _desc_classes)
    if any(a.__class__ not in (int, float, bool) for i, a in enumerate(args) if i not in slots):
        return None
    kinds = tuple(args[i].__class__ is _Tensor for i in slots)
    aligned = tuple(kv[0][3][i][1] for i, t in zip(slots, kinds) if t)
    template = [None if i in slots else a for i, a in enumerate(args)]
    return PreparedSlots(e, (kernel, grid, (), dict(meta)), dev, kv[0][2], aligned, slots, kinds, template)


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for grids. ``triton.cdiv`` is a ``ConstexprFunction`` (Triton 3.5 on): called from host
    code it unwraps its arguments first, 3-5 us a call on the H200's host (4 calls per flash forward +
    backward, measured with a host profile)."""
    return -(-a // b)


def clear() -> None:
    """Forget every direct entry and prepared launch (tests; kernels recompiled by another cache)."""
    _kernels.clear()
    _layouts.clear()
    clear_sites()


def clear_sites() -> None:
    """Forget every prepared launch (what a launch site keyed them by changed meaning: a plan table
    edited, a path limit moved)."""
    for c in _site_caches:
        c.clear()
