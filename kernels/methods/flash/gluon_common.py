"""What the Gluon flash kernels for Hopper (``fwd_gluon``, ``bwd_gluon``) share: Gluon's Hopper modules
(or why this Triton has none: ``GLUON_ERROR``), the limits (head dims, registers, shared memory), the wgmma
layouts, the program prologues, ring barriers and masks both passes use, which inputs the kernels take
(``supported``) and their TMA descriptors (``descriptor``)."""

from __future__ import annotations

import os
from typing import Optional

import torch

from kernels.methods.flash.tiles import interpreter_enabled, tma_eligible
from kernels.runtime.device import device_props

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                                   warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor

    # TMA's global -> shared copy: async_copy_global_to_shared in Triton 3.6, renamed async_load by 3.9
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    GLUON_ERROR: Optional[str] = None
except Exception as exc:  # pragma: no cover - a Triton without Gluon's Hopper module
    gluon = gl = mbarrier = tma = warpgroup_mma = warpgroup_mma_wait = fence_async_shared = None
    GluonDescriptor = _tma_load = None
    GLUON_ERROR = f"this Triton has no Gluon Hopper module ({type(exc).__name__}: {exc})"

try:  # the descriptor's fields with defaults (padding, and more in newer Tritons), for _unchecked
    import dataclasses as _dc

    _DESCRIPTOR_CLASS = GluonDescriptor
    _DESCRIPTOR_DEFAULTS = {f.name: f.default for f in _dc.fields(GluonDescriptor) if f.default is not _dc.MISSING}
except Exception:  # pragma: no cover - no Gluon, or a descriptor that is not a dataclass: the checked way
    _DESCRIPTOR_CLASS = _DESCRIPTOR_DEFAULTS = None

HEAD_DIMS = (64, 128)
CONSUMER_REGS = 240  # per consumer thread (setmaxnreg; the producer's warps give theirs up)
CONSUMER_REGS_3 = 160  # the same with three consumer warpgroups (the Gluon forward's 192-query work tiles)
SHARED_LIMIT = 227 * 1024  # shared memory one program may opt in to on sm_90


# (defined below where Gluon is)
mma_layout = operand_layout = row_layout = _key_range = _lpt_program = _query_program = _ring_barriers = None
_mask_tile = None

if gluon is not None:

    @gluon.constexpr_function
    def mma_layout(n):
        """The wgmma accumulator layout of one warpgroup's 64 x n tile."""
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 16])

    @gluon.constexpr_function
    def operand_layout(n):
        """A 16-bit left operand held in registers, of a product whose accumulator is mma_layout(n)."""
        return gl.DotOperandLayout(operand_index=0, parent=mma_layout(n), k_width=2)

    @gluon.constexpr_function
    def row_layout(n):
        """One warpgroup's rows of n 16-bit columns read as 16-byte vectors: a row's n / 8 threads side by side
        (coalesced from global memory; one swizzle chunk each from an NVMMA-swizzled shared tile)."""
        return gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[32 * 8 // n, n // 8], warps_per_cta=[4, 1],
                                order=[1, 0])

    @gluon.jit
    def _key_range(r0, TQ, TK, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
        """For queries r0 .. r0 + BLOCK_M: keys [0, full) every one of them sees (no mask), none sees a key
        from hi on (tiles.key_bounds, for these kernels); hi = 0 where all of them lie past Tq (the last
        program's later consumers, one-query shapes) or before 0 (a causal three-consumer forward's first
        block): nothing of theirs is stored."""
        if CAUSAL:
            hi = gl.maximum(gl.minimum(r0 + BLOCK_M + TK - TQ, TK), 0)
            full = gl.maximum(gl.minimum(r0 + TK - TQ + 1, TK), 0) // BLOCK_N * BLOCK_N
        else:
            hi = TK
            full = TK // BLOCK_N * BLOCK_N
        if r0 >= TQ or r0 + BLOCK_M <= 0:
            hi = 0
        return hi, full

    @gluon.jit
    def _lpt_program(n_sec, H, LPT: gl.constexpr):
        """(b, h, rank) of this program of a grid (blocks, H, B), rank 0 a head's heaviest block: the programs start
        (in the order of their linear index) in sections of n_sec heads, in a section every head's heaviest block,
        then every head's next, ..., the last section maybe smaller (FA3's LPT order: the lightest programs start
        last, so the grid's last wave is short, while the tiles they stream are a section's, sized to stay in L2);
        without LPT (or n_sec = 1), head by head: (program_id(2), program_id(1), program_id(0)), which the compiler
        may read again rather than keep (the sections' divisions cost the d = 128 dk/dv pass 32 bytes more of
        spill)."""
        if not LPT:
            return gl.program_id(2), gl.program_id(1), gl.program_id(0)
        n_blk = gl.num_programs(0)
        n_bh = gl.num_programs(1) * gl.num_programs(2)
        t = gl.program_id(0) + n_blk * (gl.program_id(1) + gl.num_programs(1) * gl.program_id(2))
        sec = t // (n_sec * n_blk)
        j = t - sec * (n_sec * n_blk)
        heads = gl.minimum(n_sec, n_bh - sec * n_sec)
        bh = sec * n_sec + j % heads
        return bh // H, bh % H, j // heads

    @gluon.jit
    def _query_program(TQ, TK, n_sec, H, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
                       LPT: gl.constexpr):
        """A program over 2 x BLOCK_M queries of (batch, head), heaviest first when causal (the last query
        blocks see the most keys; across sections of n_sec heads, ``_lpt_program``): (b, h, its first query m0,
        the key tiles up to its last visible key)."""
        b, h, pid_m = _lpt_program(n_sec, H, LPT)
        if CAUSAL:
            pid_m = gl.num_programs(0) - 1 - pid_m
        m0 = pid_m * (2 * BLOCK_M)
        if CAUSAL:
            hi = gl.maximum(gl.minimum(m0 + 2 * BLOCK_M + TK - TQ, TK), 0)
        else:
            hi = TK
        return b, h, m0, (hi + BLOCK_N - 1) // BLOCK_N

    @gluon.jit
    def _ring_barriers(STAGES: gl.constexpr, FIXED: gl.constexpr = 2, CONSUMERS: gl.constexpr = 2):
        """(fixed, ready, empty): a barrier per fixed tile (FIXED: one per consumer, per buffer of them); per ring
        slot one the TMA completes (ready) and one every consumer arrives on when done with the slot (empty)."""
        fixed = gl.allocate_shared_memory(gl.int64, [FIXED, 1], mbarrier.MBarrierLayout())
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(FIXED):
            mbarrier.init(fixed.index(i), count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=CONSUMERS)  # every consumer releases a slot
        return fixed, ready, empty

    @gluon.jit
    def _mask_tile(z, offs_m, n0, full, TQ, TK, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
        """z (queries x BLOCK_N keys from n0) with -inf where a key is past Tk (TMA read it as zeros) or,
        causal, after the query's last visible key; tiles before `full` need neither and pass as they are."""
        if n0 + BLOCK_N > full:
            offs_n = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma_layout(BLOCK_N)))
            keep = offs_n[None, :] < TK
            if CAUSAL:
                keep = keep & (offs_n[None, :] <= offs_m[:, None] + (TK - TQ))
            z = gl.where(keep, z, float("-inf"))
        return z


#: Whether the Gluon kernels take grouped-query attention (k and v with fewer heads than q, ``KV_GROUP``). Their
#: grouped path compiles for sm_90 (tests/test_flash_gluon_compile.py) and launches over the kv heads as the CPU
#: tests check, but has not yet run on a GPU: until its GPU tests (tests/test_flash_gqa.py, which turn it on) and
#: the attention bench have, grouped heads run the Triton kernels, as before it existed. The environment variable
#: HARNESS_FLASH_GLUON_GROUPED=1 turns it on for a process (to measure it: benches and studies record the setting,
#: harness.env).
def grouped_switch(environ=os.environ) -> bool:
    """HARNESS_FLASH_GLUON_GROUPED: "1" on; unset or "0" off; anything else refused, naming what is accepted."""
    value = environ.get("HARNESS_FLASH_GLUON_GROUPED", "0")
    if value not in ("0", "1"):
        raise ValueError(f"HARNESS_FLASH_GLUON_GROUPED={value!r}: 1 (grouped heads by the Gluon kernels) or 0 (by the "
                         "Triton kernels, the default)")
    return value == "1"


GROUPED = grouped_switch()


def supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Optional[str]:
    """Why the Gluon forward cannot take these inputs (None: it can): where they are (``device_reason``), then
    what they are (``inputs_reason``)."""
    return device_reason(q) or inputs_reason(q, k, v)


def device_reason(q: torch.Tensor) -> Optional[str]:
    """Why the Gluon kernels cannot run where q is (None: a Hopper GPU and a Triton with Gluon)."""
    if GLUON_ERROR:
        return GLUON_ERROR
    if interpreter_enabled() or not q.is_cuda:
        return "the Gluon forward runs on a GPU only (not in Triton's interpreter)"
    idx = q.device.index if q.device.index is not None else torch.cuda.current_device()
    props = device_props(torch.device("cuda", idx))
    if (props.major, props.minor) != (9, 0):
        return (f"the Gluon forward uses Hopper's wgmma (compute capability 9.0; this GPU has "
                f"{(props.major, props.minor)})")
    return None


def inputs_reason(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Optional[str]:
    """Why the Gluon kernels cannot take these tensors wherever they are (None: they can): dtype, head dims,
    TMA-readable strides, kv heads dividing q's (grouped ones while ``GROUPED``), no empty input."""
    if q.dtype not in (torch.bfloat16, torch.float16):
        return f"the Gluon forward takes bfloat16 or float16 (got {q.dtype})"
    d, dv = q.shape[-1], v.shape[-1]
    if d != dv or d not in HEAD_DIMS:
        return f"the Gluon forward takes d = dv in {HEAD_DIMS} (got d={d}, dv={dv})"
    if not tma_eligible(q, k, v):
        return "the Gluon forward reads by TMA: 16-byte aligned bases and strides"
    if k.shape[1] < 1 or q.shape[1] % k.shape[1] or v.shape[1] != k.shape[1]:
        return (f"the Gluon kernels take k and v with a number of heads dividing q's (got {q.shape[1]}, "
                f"{k.shape[1]} and {v.shape[1]})")
    if k.shape[1] != q.shape[1] and not GROUPED:
        return (f"the Gluon kernels' grouped-query path is off until checked on a GPU (gluon_common.GROUPED; got "
                f"{q.shape[1]} query heads on {k.shape[1]} kv heads): grouped heads run the Triton kernels")
    if not q.numel() or not k.numel():
        return "the Gluon forward takes no empty inputs (TMA descriptors need every dimension >= 1)"
    return None


_LAYOUTS: dict = {}
#: Whether descriptors are made without the dataclass's checks (None: not yet known; the first call compares
#: the two ways). The callers pass only tensors ``supported`` / ``tma_eligible`` took, which is what those
#: checks ask (16-byte aligned base and strides, last stride 1, no empty dimension); the checks cost about
#: 3 us a descriptor on a fast host, and a forward + backward makes seven.
_UNCHECKED: Optional[bool] = None


def _unchecked(t: torch.Tensor, block: list, layout):
    d = object.__new__(_DESCRIPTOR_CLASS)
    d.__dict__.update(_DESCRIPTOR_DEFAULTS)
    d.base, d.shape, d.strides, d.block_shape, d.layout = t, list(t.shape), list(t.stride()), block, layout
    return d


def descriptor(t: torch.Tensor, rows: int, cols: Optional[int] = None):
    """A 4-D TMA descriptor of a (B, H, T, d) tensor with its strides (16-bit, or the backward's fp32 dq sums),
    boxes of one (batch, head)'s rows x cols (default d; its shared-memory layout made once per box and dtype)."""
    global _UNCHECKED
    cols = t.shape[-1] if cols is None else cols
    block = [1, 1, rows, cols]
    key = (rows, cols, t.dtype)
    layout = _LAYOUTS.get(key)
    if layout is None:
        layout = _LAYOUTS[key] = gl.NVMMASharedLayout.get_default_for(
            block, {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32}[t.dtype])
    if _UNCHECKED and _DESCRIPTOR_DEFAULTS is not None:
        return _unchecked(t, block, layout)
    checked = GluonDescriptor(t, list(t.shape), list(t.stride()), block, layout)
    if _UNCHECKED is None:  # (a Triton whose descriptor is not a plain dataclass keeps the checked way)
        try:
            _UNCHECKED = _unchecked(t, list(block), layout) == checked
        except Exception:
            _UNCHECKED = False
    return checked
