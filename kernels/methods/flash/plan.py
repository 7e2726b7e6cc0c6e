"""Launch plans of the flash kernels: every tunable knob, the table the H200 sweep fills, the lookup.

A plan is chosen once per (head dim, value head dim, dtype, causal, Tq, Tk) and cached, so the hot
path pays one dict lookup. ``TABLE`` holds measured entries; shapes it does not cover get
``default_plans`` (the Triton fused-attention tutorial's Hopper starting points). Where a Gluon entry
cannot run, ``triton_plans`` gives the Triton kernels' measured plans (``TRITON_TABLE``). Blocks are clamped
to the sequence lengths (a block never exceeds the next power of two of its T, minimum 16, the
smallest ``tl.dot`` tile), so T = 1 does not run 128-row tiles. ``override`` forces plans (tests,
the sweep).
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Iterator, Optional

import torch

from kernels.methods.flash import gluon_common
from kernels.runtime import fastlaunch

#: How the kernels load and store their tiles: plain pointers (masked loads, cp.async pipelining),
#: host-side tensor descriptors (TMA; triton.tools.tensor_descriptor.TensorDescriptor, passed as
#: kernel parameters), or descriptors built on the device (tl.make_tensor_descriptor; needs a
#: scratch allocator). TMA needs 16-byte aligned base pointers and strides; other inputs use pointers.
TMA_MODES = ("off", "host", "device")
#: Where the backward computes dq: its own programs ("pass"), or the dk/dv programs, adding their
#: shares into an fp32 buffer element by element ("atomic") or a tile at a time by TMA reductions
#: ("tma_add": cp.reduce.async.bulk through a tensor descriptor, sm_90+). In the Triton kernels both adding
#: modes lost to the pass, measured on an H200 (docs/perf.md); the sweep tries them.
DQ_MODES = ("pass", "atomic", "tma_add")


@dataclass(frozen=True)
class FwdPlan:
    """Forward: one program per (BLOCK_M queries, head, batch), looping over BLOCK_N keys.
    ``group`` (causal only): the order programs start in. 1: head by head, each head's query blocks
    heaviest first (its keys and values stay in L2 while its programs run); G > 1: G heads at a time,
    all their heaviest blocks first, then the next lighter ones, so the last programs of the grid are
    the lightest (a shorter tail when the last wave leaves SMs idle), for G heads' keys and values in
    L2 at once. On an H200 at (16, 12, 1024, 64) no G moved the forward beyond the sweep's noise
    (-2% to +2%, docs/perf.md), so the table keeps 1."""

    block_m: int = 128
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3  # software-pipelining depth of the key loop (loads in flight)
    tma: str = "off"
    warp_specialize: bool = False  # tl.range(..., warp_specialize=True): producer/consumer warps
    group: int = 1
    gluon: int = 0  # the Gluon kernel (fwd_gluon): 1 consumers free-running, 2 ping-pong; block_m = 128 (two
    # consumer warpgroups) or 192 (three: d = 64, or d = 128 with block_n 64), block_n 64 or 128, num_stages = ring
    # slots (0: Triton's)
    persistent: bool = False  # (Gluon) a program per SM looping over work tiles, the next one's loads under this one
    overlap: bool = False  # (Gluon) a tile's softmax runs while the previous tile's p v does (FA3's intra-warpgroup
    # overlap: p v issued a tile late, behind the next q k^T)
    section_mb: int = 0  # (Gluon, persistent, causal) the heaviest-first order a section of heads at a time, their
    # keys and values at most this many MB (they stay in L2; FA3's L2 swizzle); 0: every head in one section
    maxnreg: int = 0  # (the Triton kernel) registers a thread at most (ptxas's cap: more programs an SM where
    # registers bound them, e.g. 96 for five 4-warp programs); 0: the compiler's choice. At (16, 12, 1024, 64) 96
    # lost on an H100 (docs/perf.md), since 3 slots' shared memory holds four programs an SM anyway
    sum_mma: bool = False  # the row sums l by the tensor cores (p times a tile of ones beside p v; l then sums the
    # 16-bit p that p v multiplies: the normalization matches the numerator) instead of a reduction of p. Forward on
    # an H100 (docs/perf.md): the Gluon three consumers with 128-key tiles +1.6-3.5% at (4, 12, 4096, 64) and
    # (1, 12, 16384, 64); with 64-key tiles at d = 128 -1.1%; the Triton kernel's 64 x 64 tiles at (16, 12, 1024, 64)
    # -7.5% (Triton waits for each of the two products on its own)

    one_loop: bool = False  # (the Triton kernel) the masked tiles (causal diagonal, end of the keys) in the full
    # tiles' pipelined loop under a branch, not a second loop whose loads start only when the first has drained (sm_90
    # SASS: 944 instructions against 1490, the second loop's prologue gone). On an H100 (docs/perf.md): (16, 12, 1024,
    # 64) 276-281 -> 287-295 TFLOP/s; the Triton plan at (8, 16, 2048, 128) 384 -> 410, at (4, 12, 4096, 64) 383 -> 376
    # (64 tiles a program: the prologue weighs little there)

    def __post_init__(self) -> None:
        _check_blocks(self, ("block_n",) if self.gluon and self.block_m == 192 else ("block_m", "block_n"))
        if not isinstance(self.group, int) or self.group < 1:
            raise ValueError(f"FwdPlan.group={self.group!r}: heads per group of the causal program order, an int >= 1")
        if self.gluon not in (0, 1, 2):
            raise ValueError(f"FwdPlan.gluon={self.gluon!r}: 0 (the Triton kernel), 1 (Gluon) or 2 (Gluon, ping-pong)")
        if self.gluon and (self.block_m not in (128, 192) or self.block_n not in (64, 128) or self.num_stages < 2):
            raise ValueError(f"FwdPlan(gluon={self.gluon}) takes block_m 128 or 192 (two or three consumer warpgroups "
                             f"of 64 queries), block_n 64 or 128 and num_stages >= 2; got block_m={self.block_m}, "
                             f"block_n={self.block_n}, num_stages={self.num_stages}")
        if self.persistent and not self.gluon:
            raise ValueError("FwdPlan(persistent=True) is the Gluon forward's (gluon=1 or 2); the Triton kernel runs "
                             "a program a tile")
        check_section_mb(self.section_mb, "FwdPlan.section_mb")
        if self.section_mb and not self.persistent:
            raise ValueError("FwdPlan(section_mb > 0) orders the persistent Gluon forward's work tiles "
                             "(persistent=True); a program a tile starts head by head already")
        if self.overlap and not self.gluon:
            raise ValueError("FwdPlan(overlap=True) is the Gluon forward's (gluon=1 or 2); the Triton kernel's "
                             "pipelining is Triton's")
        if self.sum_mma and (self.gluon == 2 or self.overlap):
            raise ValueError("FwdPlan(sum_mma=True) is the Triton kernel's or the free-running Gluon consumers' "
                             "(gluon=0, or gluon=1 with overlap=False); ping-pong and the overlap take sum_mma=False")
        if self.one_loop and (self.gluon or self.sum_mma or self.warp_specialize):
            raise ValueError("FwdPlan(one_loop=True) is the Triton kernel's (gluon=0) without sum_mma or "
                             "warp_specialize; set those to their defaults")
        if self.maxnreg and (self.gluon or not isinstance(self.maxnreg, int) or not 24 <= self.maxnreg <= 255):
            raise ValueError(f"FwdPlan.maxnreg={self.maxnreg!r}: the Triton kernel's (gluon=0) register cap a thread, "
                             f"an int in 24..255, or 0 for the compiler's choice (the Gluon kernel sets its own)")


@dataclass(frozen=True)
class BwdPlan:
    """Backward: the dk/dv kernel keeps BLOCK_N1 keys and loops over BLOCK_M1 queries; the dq
    kernel keeps BLOCK_M2 queries and loops over BLOCK_N2 keys (no atomics); the delta kernel takes
    ``pre_block`` rows a program. ``fused``: the dk/dv and dq programs share one launch (one grid,
    ``num_warps``/``num_stages`` for both), else two launches (dq with ``dq_warps``/``dq_stages``).
    ``dq_mode``: "pass" (dq in its own programs, as above), "atomic" (the dk/dv programs add dq into
    an fp32 buffer by atomic adds; no dq programs, so the dq fields and ``fused`` do not apply) or
    "tma_add" (the same adds, one TMA reduction per tile; "atomic" where TMA is not there)."""

    block_m1: int = 32
    block_n1: int = 128
    block_m2: int = 128
    block_n2: int = 32
    num_warps: int = 4
    num_stages: int = 3
    dq_warps: int = 4
    dq_stages: int = 3
    tma: str = "off"
    warp_specialize: bool = False
    fused: bool = False
    pre_block: int = 64
    dq_mode: str = "pass"
    gluon: int = 0  # 1: the dk/dv pass in Gluon (bwd_gluon): block_n1 = 128, block_m1 32 or 64, num_stages slots,
    # with dq_mode "pass" the Triton dq pass after it, "tma_add" dq added by it (TMA reductions, block_m1 = 64);
    # 2: the dq pass in Gluon too: block_m2 = 128, block_n2 64 or 128, dq_stages slots
    delta_in_dq: bool = False  # the dq pass (Triton's, or with gluon=2 the Gluon one) forms delta = rowsum(o * do)
    # for its rows and runs first, the dk/dv pass reading it: no delta kernel (one launch and one read of do
    # fewer); dq_mode "pass", unfused
    overlap: bool = False  # (the Gluon dk/dv pass) dp^T issued with s^T, each wait for the product needed next:
    # p^T's exponentials run under dp^T, ds^T under dv's product
    dq_split: bool = False  # (the Gluon dk/dv pass adding dq) both consumers form half of dq's columns every query
    # tile, instead of taking turns at all of them (FA3's split: half the accumulator, no consumer idles)
    one_loop: bool = False  # (the Triton kernels) the causal diagonal's tiles in the full tiles' pipelined loop, masked
    # under a branch, not a loop of their own whose loads start only when the other has drained (FwdPlan.one_loop).
    # The fused backward at (16, 12, 1024, 64): +2% forward + backward, measured on an H100 (docs/perf.md)
    lpt_mb: int = 0  # (the Gluon passes) the order the programs start in: 0 head by head, each head's heaviest
    # blocks first; > 0 in sections of heads whose streamed tiles (dk/dv: q and do; dq: k and v) take at most this many
    # MB, every head's heaviest block of a section first, then every head's next (FA3's LPT order): the grid's last
    # programs are the lightest of all, not a head's lightest after the last head's heaviest (bwd_gluon.lpt_heads)

    def __post_init__(self) -> None:
        _check_blocks(self, ("block_m1", "block_n1", "block_m2", "block_n2", "pre_block"))
        if self.dq_mode not in DQ_MODES:
            raise ValueError(f"BwdPlan.dq_mode={self.dq_mode!r}: one of {', '.join(DQ_MODES)}")
        if self.dq_mode != "pass" and self.fused:
            raise ValueError("BwdPlan: fused=True launches the dq programs beside the dk/dv ones; "
                             f"dq_mode={self.dq_mode!r} has no dq programs (use fused=False)")
        if self.gluon not in (0, 1, 2):
            raise ValueError(f"BwdPlan.gluon={self.gluon!r}: 0 (Triton), 1 (the dk/dv pass in Gluon) or 2 (dq too)")
        if self.gluon and (self.block_n1 != 128 or self.block_m1 not in (32, 64) or self.num_stages < 2
                           or self.fused or self.dq_mode == "atomic"):
            raise ValueError(f"BwdPlan(gluon={self.gluon}) takes block_n1=128 (two consumer warpgroups of 64 keys), "
                             f"block_m1 32 or 64, num_stages >= 2, fused=False and dq_mode 'pass' or 'tma_add'; got "
                             f"block_n1={self.block_n1}, block_m1={self.block_m1}, num_stages={self.num_stages}, "
                             f"fused={self.fused}, dq_mode={self.dq_mode!r}")
        if self.gluon and self.dq_mode == "tma_add" and (self.gluon != 1 or self.block_m1 != 64):
            raise ValueError(f"BwdPlan(gluon={self.gluon}, dq_mode='tma_add'): dq added by the Gluon dk/dv kernel "
                             f"takes gluon=1 (no dq pass) and block_m1=64 (a warpgroup's 64-query dq tile); got "
                             f"block_m1={self.block_m1}")
        if self.delta_in_dq and (self.dq_mode != "pass" or self.fused):
            raise ValueError(f"BwdPlan(delta_in_dq=True): the dq pass forms delta and runs before dk/dv, so "
                             f"dq_mode='pass' and fused=False; got dq_mode={self.dq_mode!r}, fused={self.fused}")
        if self.dq_split and not (self.gluon == 1 and self.dq_mode == "tma_add"):
            raise ValueError(f"BwdPlan(dq_split=True) splits the dq that the Gluon dk/dv kernel adds: gluon=1 and "
                             f"dq_mode='tma_add'; got gluon={self.gluon}, dq_mode={self.dq_mode!r}")
        if self.one_loop and (self.gluon == 2 or (self.gluon == 1 and self.dq_mode == "tma_add")):
            raise ValueError("BwdPlan(one_loop=True) is the Triton kernels' (gluon=0, or gluon=1 with the Triton dq "
                             "pass, dq_mode='pass'); this plan runs none of them")
        if self.overlap and not self.gluon:
            raise ValueError("BwdPlan(overlap=True) is the Gluon dk/dv pass's (gluon=1 or 2); the Triton kernels' "
                             "pipelining is Triton's")
        check_section_mb(self.lpt_mb, "BwdPlan.lpt_mb", "the tiles a Gluon pass streams", "head by head")
        if self.lpt_mb and not self.gluon:
            raise ValueError("BwdPlan(lpt_mb > 0) orders the Gluon passes' programs (gluon=1 or 2); the Triton "
                             "kernels start head by head")
        if self.gluon == 2 and (self.block_m2 != 128 or self.block_n2 not in (64, 128) or self.dq_stages < 2):
            raise ValueError(f"BwdPlan(gluon=2) takes block_m2=128 (two consumer warpgroups of 64 queries), "
                             f"block_n2 64 or 128 and dq_stages >= 2; got block_m2={self.block_m2}, "
                             f"block_n2={self.block_n2}, dq_stages={self.dq_stages}")


def check_section_mb(value, name: str = "section_mb", tiles: str = "keys and values",
                     zero: str = "every head in one section") -> None:
    """Sections of heads in a program order, an int >= 0 of MB of the tiles a section holds: the persistent Gluon
    forward's (``FwdPlan.section_mb``, ``fwd_gluon.launch_fwd``; its keys and values) or, with ``tiles`` and
    what 0 means (``zero``) given, the Gluon backward's (``BwdPlan.lpt_mb``)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name}={value!r}: MB of {tiles} a section of heads holds, an int >= 0 (0: {zero})")


def _check_blocks(plan, names) -> None:
    for name in names:
        b = getattr(plan, name)
        if b < 16 or b & (b - 1):
            raise ValueError(f"{type(plan).__name__}.{name}={b}: blocks are powers of two >= 16")
    if plan.tma not in TMA_MODES:
        raise ValueError(f"{type(plan).__name__}.tma={plan.tma!r}: one of {', '.join(TMA_MODES)}")


def head_pad(d: int) -> int:
    """The tile width of a head dimension: the next power of two, at least 16 (masked loads)."""
    return max(16, 1 << (d - 1).bit_length())


def default_plans(d_pad: int, dtype: torch.dtype, causal: bool) -> tuple[FwdPlan, BwdPlan]:
    """The tutorial's Hopper starting points (before the sweep): 128 x 64 forward tiles, 8 warps at
    d = 128; backward 32 x 128 (dk/dv) and 128 x 32 (dq), halved at d = 128. The dk/dv kernel gets
    8 warps: compiled for sm_90 by Triton 3.6 with 4 it needs 255 registers a thread and spills at
    d = 64 (its two fp32 accumulators of BLOCK_N1 x d), with 8 it takes 172 (191 at d = 128).
    fp32 (no tensor-core path at full precision: FMA dots) gets small tiles."""
    if dtype == torch.float32:  # sized so that Triton 3.6's sm_90 build does not spill
        if d_pad <= 64:
            return (FwdPlan(block_m=64, block_n=32, num_warps=8, num_stages=2),
                    BwdPlan(block_m1=16, block_n1=64, block_m2=64, block_n2=16, num_warps=8, num_stages=2,
                            dq_warps=8, dq_stages=2))
        return (FwdPlan(block_m=32, block_n=16, num_warps=4, num_stages=2),
                BwdPlan(block_m1=16, block_n1=32, block_m2=32, block_n2=16, num_warps=8, num_stages=2,
                        dq_warps=4, dq_stages=2))
    if d_pad <= 64:
        return FwdPlan(block_m=128, block_n=64, num_warps=4, num_stages=3), BwdPlan(num_warps=8, num_stages=4,
                                                                                   dq_stages=4)
    return (FwdPlan(block_m=128, block_n=64, num_warps=8, num_stages=3),
            BwdPlan(block_m1=32, block_n1=64, block_m2=64, block_n2=32, num_warps=8, num_stages=3,
                    dq_warps=4, dq_stages=3))


#: (padded head dim, dtype name, causal) -> ((max T, FwdPlan, BwdPlan), ...) by ascending max T: the
#: first entry whose max T >= max(Tq, Tk) is used (the last one beyond). Filled from sweeps on an H200 and an
#: H100 (``python -m kernels.methods.flash.sweep``, which prints entries in this form), each entry read again
#: through ``python -m harness.bench attention``; the numbers behind each entry: docs/perf.md, "Launch tables".
TABLE: dict[tuple[int, str, bool], tuple[tuple[int, FwdPlan, BwdPlan], ...]] = {
    (64, "bfloat16", True): (
        # T <= 1024: Triton tiles (several programs an SM) beat the Gluon kernels here; fused backward; one loop
        (1024, FwdPlan(block_m=64, block_n=64, num_warps=4, num_stages=3, one_loop=True),
         BwdPlan(block_m1=32, block_n1=64, block_m2=64, block_n2=64, num_warps=4, num_stages=3, dq_warps=4,
                 dq_stages=3, fused=True, one_loop=True)),
        # longer: Gluon, three consumers, row sums by MMA; dk/dv adding dq by TMA, overlap, 16 MB LPT sections
        (1 << 30, FwdPlan(block_m=192, block_n=128, num_warps=4, num_stages=3, gluon=1, persistent=True,
                          sum_mma=True),
         BwdPlan(block_m1=64, block_n1=128, block_m2=128, block_n2=64, num_warps=4, num_stages=3, dq_warps=8,
                 dq_stages=4, dq_mode="tma_add", gluon=1, lpt_mb=16, overlap=True)),
    ),
    (128, "bfloat16", True): (
        # Gluon, three consumers on 64-key tiles, 32 MB L2 sections; Gluon dq pass forming delta, then dk/dv, overlap
        (1 << 30, FwdPlan(block_m=192, block_n=64, num_warps=4, num_stages=3, gluon=1, persistent=True,
                          section_mb=32),
         BwdPlan(block_m1=64, block_n1=128, block_m2=128, block_n2=64, num_warps=4, num_stages=2, dq_warps=8,
                 dq_stages=3, gluon=2, delta_in_dq=True, overlap=True)),
    ),
}

#: The Triton kernels' measured plans for keys whose TABLE entry is a Gluon plan: what such an entry falls back to
#: where the Gluon kernels cannot take the inputs (head dims other than 64 and 128, padded to them here; strides TMA
#: cannot read; GPUs other than Hopper). Swept on an H200 (docs/perf.md): (4, 12, 4096, 64) forward + backward 322
#: TFLOP/s (the defaults: 267), (8, 16, 2048, 128) 335 (defaults: 205). The d = 128 forward takes one_loop (384 -> 410
#: forward on an H100), the d = 64 one does not (383 -> 376 at 4096).
TRITON_TABLE: dict[tuple[int, str, bool], tuple[tuple[int, FwdPlan, BwdPlan], ...]] = {
    (64, "bfloat16", True): (
        (1 << 30, FwdPlan(block_m=64, block_n=64, num_warps=4, num_stages=3),
         BwdPlan(block_m1=32, block_n1=64, block_m2=128, block_n2=64, num_warps=4, num_stages=3, dq_warps=8,
                 dq_stages=4)),
    ),
    (128, "bfloat16", True): (
        (1 << 30, FwdPlan(block_m=64, block_n=64, num_warps=4, num_stages=3, one_loop=True),
         BwdPlan(block_m1=64, block_n1=64, block_m2=128, block_n2=64, num_warps=4, num_stages=2, dq_warps=8,
                 dq_stages=4)),
    ),
}

_CACHE: dict[tuple, tuple[FwdPlan, BwdPlan]] = {}
_TRITON_CACHE: dict[tuple, tuple[FwdPlan, BwdPlan]] = {}
_CACHE_MAX = 4096
_OVERRIDE: list[tuple[Optional[FwdPlan], Optional[BwdPlan]]] = []


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def table_plans(d_pad: int, dtype: torch.dtype, causal: bool, t: int,
                table: Optional[dict] = None) -> Optional[tuple[FwdPlan, BwdPlan]]:
    """The table's entry for these settings (``TABLE`` unless another is given), or None when it has none."""
    rows = (TABLE if table is None else table).get((d_pad, _dtype_name(dtype), causal))
    if not rows:
        return None
    for max_t, fwd, bwd in rows:
        if t <= max_t:
            return fwd, bwd
    return rows[-1][1], rows[-1][2]


def _pow2_at_least(n: int) -> int:
    return max(16, 1 << (max(n, 1) - 1).bit_length())


def clamp(fwd: FwdPlan, bwd: BwdPlan, tq: int, tk: int) -> tuple[FwdPlan, BwdPlan]:
    """Blocks no larger than the sequence they tile (rounded up to a power of two, at least 16)."""
    pq, pk = _pow2_at_least(tq), _pow2_at_least(tk)
    if not fwd.gluon:  # (the Gluon kernel's tiles are fixed; TMA reads rows past T as zeros)
        fwd = dataclasses.replace(fwd, block_m=min(fwd.block_m, pq), block_n=min(fwd.block_n, pk))
    if bwd.gluon == 2:  # (the Gluon kernels' tiles are fixed; TMA reads rows past T as zeros)
        bwd = dataclasses.replace(bwd, pre_block=min(bwd.pre_block, pq))
    elif bwd.gluon:
        bwd = dataclasses.replace(bwd, block_m2=min(bwd.block_m2, pq), block_n2=min(bwd.block_n2, pk),
                                  pre_block=min(bwd.pre_block, pq))
    else:
        bwd = dataclasses.replace(bwd, block_m1=min(bwd.block_m1, pq), block_n1=min(bwd.block_n1, pk),
                                  block_m2=min(bwd.block_m2, pq), block_n2=min(bwd.block_n2, pk),
                                  pre_block=min(bwd.pre_block, pq))
    return fwd, bwd


def plans_for(d: int, dv: int, dtype: torch.dtype, causal: bool, tq: int, tk: int) -> tuple[FwdPlan, BwdPlan]:
    """The forward and backward plans of one problem (cached; an active ``override`` wins)."""
    if _OVERRIDE:
        f, b = _OVERRIDE[-1]
        base = default_plans(head_pad(max(d, dv)), dtype, causal)
        return clamp(f or base[0], b or base[1], tq, tk)
    key = (d, dv, dtype, causal, tq, tk)
    hit = _CACHE.get(key)
    if hit is None:
        d_pad = head_pad(max(d, dv))
        hit = table_plans(d_pad, dtype, causal, max(tq, tk)) or default_plans(d_pad, dtype, causal)
        hit = clamp(*hit, tq, tk)
        if len(_CACHE) >= _CACHE_MAX:  # many distinct lengths (evaluation, variable T): start over
            _CACHE.clear()
        _CACHE[key] = hit
    return hit


def triton_plans(d: int, dv: int, dtype: torch.dtype, causal: bool, tq: int, tk: int) -> tuple[FwdPlan, BwdPlan]:
    """The Triton kernels' plans for a problem whose plan is a Gluon one the Gluon kernels cannot take: per
    direction, the table's plan where it is a Triton one, else ``TRITON_TABLE``'s, else the defaults (cached)."""
    key = (d, dv, dtype, causal, tq, tk)
    hit = _TRITON_CACHE.get(key)
    if hit is None:
        d_pad = head_pad(max(d, dv))
        base = default_plans(d_pad, dtype, causal)
        measured = table_plans(d_pad, dtype, causal, max(tq, tk), TRITON_TABLE) or base
        first = table_plans(d_pad, dtype, causal, max(tq, tk)) or base
        hit = clamp(first[0] if not first[0].gluon else measured[0], first[1] if not first[1].gluon else measured[1],
                    tq, tk)
        if len(_TRITON_CACHE) >= _CACHE_MAX:
            _TRITON_CACHE.clear()
        _TRITON_CACHE[key] = hit
    return hit


def launch_plans(d: int, dv: int, dtype: torch.dtype, causal: bool, tq: int, tk: int,
                 grouped: bool = False) -> tuple[FwdPlan, BwdPlan]:
    """The plans the launchers run when given none: the table's (:func:`plans_for`); for grouped-query
    attention (``grouped``: Hkv < H) the same where the Gluon kernels take groups (``gluon_common.GROUPED``), else
    the Triton kernels' (:func:`triton_plans`), and a Triton backward unfused (one grid's axis 1 cannot be both
    the kv and the query heads). What the tuning tools start from. Outside an ``override`` only: there the
    launchers run the override's plans (unfused for grouped heads), which :func:`plans_for` alone returns."""
    if not grouped:
        return plans_for(d, dv, dtype, causal, tq, tk)
    if gluon_common.GROUPED:
        fwd, bwd = plans_for(d, dv, dtype, causal, tq, tk)
    else:
        fwd, bwd = triton_plans(d, dv, dtype, causal, tq, tk)
    return fwd, (dataclasses.replace(bwd, fused=False) if bwd.fused else bwd)


@contextlib.contextmanager
def override(fwd: Optional[FwdPlan] = None, bwd: Optional[BwdPlan] = None) -> Iterator[None]:
    """Use these plans (None: the defaults) for every call inside the block (tests, the sweep)."""
    _OVERRIDE.append((fwd, bwd))
    try:
        yield
    finally:
        _OVERRIDE.pop()


def overridden() -> bool:
    """Whether an ``override`` block is active (the launchers then neither use nor keep prepared launches)."""
    return bool(_OVERRIDE)


def forget() -> None:
    """Drop the cached lookups (after editing TABLE or TRITON_TABLE at run time), and the launches prepared from
    them."""
    _CACHE.clear()
    _TRITON_CACHE.clear()
    fastlaunch.clear_sites()
