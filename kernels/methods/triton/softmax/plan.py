"""Host-side launch planning of the ``triton`` softmax: the path constants, :class:`Plan`, the launch tables
(from ``python -m harness.bench triton-sweep`` on an H200; see docs/perf.md), :func:`plan` and the shape
arithmetic of the Gluon paths (:func:`gluon_unusable` says when they cannot take a launch; the device's
properties come from ``kernels.runtime.device``). No kernel here: see ``tile`` and ``gluon``; the paths
are described in the package docstring (``kernels/methods/triton/softmax/__init__.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from kernels.runtime import fastlaunch
from kernels.runtime.availability import GLUON_ERROR
from kernels.runtime.device import device_props

LOG2E = 1.4426950408889634
#: Longest row kept whole in registers; longer rows take the streaming (long) path.
MAX_TILE_N = 32768
#: Chunk length of the long path.
LONG_BLOCK_N = 8192
#: Rows longer than this take the split path (a row over several programs; the table below may start
#: it later in one direction), up to MAX_SPLITS chunks.
SPLIT_ABOVE_N = 16384
MAX_SPLITS = 128
#: Ring path (backward, 16-bit rows of MAX_TILE_N + 1 .. RING_MAX_N columns, not causal, on a GPU): warps
#: per program and ring slots (chunks of 8 x 32 x warps elements, 16 KB at 32 warps).
RING_MAX_N = 65536
RING_WARPS = 32
RING_SLOTS = 13
#: Hybrid path (forward, 16-bit rows of HYBRID_MIN_N + 1 .. RING_MAX_N columns, not causal, on a GPU):
#: warps per program and the 16-byte vectors each thread keeps in registers (the rest of the row goes
#: to shared memory: at most 96 KB at 65536 columns, so two programs fit an H200 SM), at most 64
#: registers per thread (two programs of 512 threads per SM).
HYBRID_WARPS = 16
HYBRID_REG_VECS = 4
HYBRID_MIN_N = HYBRID_REG_VECS * 8 * 32 * HYBRID_WARPS  # 16384: the registers' part, always inside the row
HYBRID_MAX_REGS = 64
_RING_MAX_WAIT = 64  # copy groups a thread may have in flight (one wait instruction per count: see gluon.py)


@dataclass(frozen=True)
class Plan:
    """How a launch covers the rows: the tile path (ROWS rows of BLOCK_N per program) or the long path."""

    long: bool
    block_n: int
    rows: int
    num_warps: int
    round_mask: bool = True  # causal rows: load whole 8-column vectors up to the prefix (see _vector_limit)
    fill: bool = False  # forward: masked columns read as a fill (see _fwd_fill_kernel); the causal rows' path
    split: bool = False  # split path: each row in chunks of block_n columns, one program per chunk
    stages: int = 0  # > 0: persistent tile path (rows = 1), rows pipelined `stages` deep (see _fwd_persist_kernel)
    programs_per_sm: int = 1  # persistent path: grid = SMs x this
    ring: bool = False  # ring path (backward; Gluon, GPU only; see _bwd_pair_ring_kernel): a program per SM
    slots: int = 0  # ring path: chunk slots in shared memory (at most; fewer where the GPU has less)
    hybrid: bool = False  # hybrid path (forward; Gluon, GPU only; see _fwd_hybrid_kernel): a program per row
    reload: bool = False  # backward tile path: y and dy read again for dx instead of held (see _bwd_tile_kernel)
    narrow: bool = False  # backward tile path: y and dy held as loaded (16-bit) and widened again for dx (ditto)

    def __post_init__(self) -> None:
        if self.reload and self.narrow:
            raise ValueError("Plan(reload=True, narrow=True): the backward tile reads y and dy again (reload) or "
                             "holds them as loaded (narrow), not both")


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


# (rows per program, warps) by BLOCK_N, from `python -m harness.bench triton-sweep` on an H200 (bf16,
# rows x N = 2^27); see docs/perf.md. Keys missing here (N < 128) use 4096-element tiles.
_FWD_TILE = {128: (64, 8), 256: (16, 4), 512: (16, 16), 1024: (8, 16), 2048: (4, 16), 4096: (1, 8),
             8192: (1, 16), 16384: (1, 16), 32768: (1, 32)}
_BWD_TILE = {128: (32, 8), 256: (16, 8), 512: (8, 4), 1024: (4, 16), 2048: (2, 16), 4096: (1, 16),
             8192: (1, 16), 16384: (1, 16), 32768: (1, 32)}


# Causal forward rows: the fill kernel's (rows per program, warps) by BLOCK_N, from `python -m harness.bench
# triton-sweep --match fill=True` on an H200 with causal scores of 2^27 elements (bf16, B x 1 x T x T,
# T = BLOCK_N; 16384: 2^28). Causal rows do uneven work (row i loads i + 1 keys and writes N): small
# programs win, one row per program from 1024 columns. Elsewhere: see _causal_fwd_heuristic.
_CAUSAL_FWD_TILE = {128: (16, 2), 256: (8, 1), 512: (4, 1), 1024: (1, 1), 2048: (1, 2), 4096: (1, 4),
                    8192: (1, 4), 16384: (1, 16)}
# Split path: chunk length, warps, and the shortest row that takes it, by direction (forward, backward).
SPLIT_BLOCK_N = 8192
SPLIT_WARPS = {False: 8, True: 8}
_SPLIT_FROM = {False: 65537, True: 32769}
# Persistent tile path (rows pipelined through shared memory), 16-bit rows: BLOCK_N -> (warps, stages),
# by direction (forward: two rows prefetched, 128 KB of shared memory; backward: y and dy of one row).
# Only the forward at 32768, where the sweep put it ahead of the plain tile (docs/perf.md has the numbers);
# at 65536 a row does not fit twice in shared memory. On a GPU the forward takes the hybrid path instead; this
# plan is its fallback. The backward's plain tile holding 16-bit rows (_BWD_NARROW) beat it at 32768 (measured,
# docs/perf.md).
_PERSIST = {False: {32768: (32, 3)}, True: {}}
# Backward tiles that hold y and dy as loaded (Plan.narrow), by BLOCK_N: the longest row that takes it. At 32768
# the one-row tile on 32 warps, 2955 GB/s (0.99 of copy) against 2605 (0.87) for the persistent path held and
# 2823 narrow, Liger 2973, in one run on an H100 (docs/perf.md); a 16-bit row's widened copy spilled
# there. At 16384 rows of up to 12288 columns (a quarter of the tile masked or more): 2991 against 2944 held
# (half the registers: two programs an SM), where full rows lose 3001 -> 2979 (measured on an H100).
_BWD_NARROW = {16384: 12288, 32768: 32768}
# Causal backward rows (the attention shape B=8, H=12, T=1024, from the sweep): (rows per program, warps,
# round_mask); other lengths use _BWD_TILE.
_CAUSAL_BWD_TILE = {1024: (1, 4, True)}


def _causal_fwd_heuristic(block_n: int) -> tuple[int, int]:
    """(rows per program, warps) of the fill kernel outside its table: 32 elements per thread, one row
    per program from 1024 columns, shorter rows packed one warp's worth (1024 elements) per program."""
    if block_n >= 1024:
        return 1, min(32, block_n // 1024)
    return 1024 // block_n, 1


_PLAN_CACHE: dict = {}


def cached_plan(n_cols: int, elem_bytes: int, backward: bool = False, causal: bool = False,
                gluon: bool = True) -> Plan:
    """:func:`plan`, computed once per argument tuple (the launch path's per-call lookup). Code that
    changes the tables or the path limits at run time (tests) calls :func:`clear_plan_cache`."""
    key = (n_cols, elem_bytes, backward, causal, gluon)
    p = _PLAN_CACHE.get(key)
    if p is None:
        p = _PLAN_CACHE[key] = plan(n_cols, elem_bytes, backward, causal, gluon)
    return p


def clear_plan_cache() -> None:
    """Forget the cached plans, and the launches prepared from them (``fastlaunch.clear_sites``)."""
    _PLAN_CACHE.clear()
    fastlaunch.clear_sites()


def plan(n_cols: int, elem_bytes: int, backward: bool = False, causal: bool = False, gluon: bool = True) -> Plan:
    """Launch settings by row length (a table measured on an H200; heuristics outside it). gluon=False:
    the plan for where the Gluon paths (hybrid forward, ring backward) cannot run (see gluon_unusable)."""
    block_n = _next_pow2(n_cols)
    split_from = max(SPLIT_ABOVE_N + 1, _SPLIT_FROM[backward])
    if gluon and not causal and elem_bytes == 2:
        if not backward and HYBRID_MIN_N < n_cols <= RING_MAX_N:
            return Plan(False, block_n, 1, HYBRID_WARPS, hybrid=True)
        if backward and MAX_TILE_N < n_cols <= RING_MAX_N:
            return Plan(False, block_n, 1, RING_WARPS, ring=True, slots=RING_SLOTS)
    if n_cols >= split_from and -(-n_cols // SPLIT_BLOCK_N) <= MAX_SPLITS:
        return Plan(False, SPLIT_BLOCK_N, 1, SPLIT_WARPS[backward], split=True)
    if not causal and elem_bytes == 2 and block_n in _PERSIST[backward]:
        warps, stages = _PERSIST[backward][block_n]
        return Plan(False, block_n, 1, warps, stages=stages)
    if block_n > MAX_TILE_N:
        block = min(LONG_BLOCK_N, block_n)
        return Plan(True, block, 1, 16 if block >= 4096 else max(4, block // 256))
    if causal and not backward:
        rows, warps = _CAUSAL_FWD_TILE.get(block_n) or _causal_fwd_heuristic(block_n)
        return Plan(False, block_n, rows, warps, fill=True)
    if causal and block_n in _CAUSAL_BWD_TILE:
        rows, warps, round_mask = _CAUSAL_BWD_TILE[block_n]
        return Plan(False, block_n, rows, warps, round_mask)
    table = _BWD_TILE if backward else _FWD_TILE
    if block_n in table:
        rows, warps = table[block_n]
        return Plan(False, block_n, rows, warps, narrow=backward and n_cols <= _BWD_NARROW.get(block_n, 0))
    rows = max(1, 4096 // block_n)  # short rows: several per program, ~16 elements per thread
    return Plan(False, block_n, rows, max(1, min(8, rows * block_n // (32 * 16))))


def _smem_per_block(device: torch.device) -> int:
    """Shared memory one program may opt in to on this GPU (48 KB where the property is missing)."""
    return getattr(device_props(device), "shared_memory_per_block_optin", 0) or 48 * 1024


def _persistent_grid(n_rows: int, device: torch.device, p: Plan) -> int:
    if device.type != "cuda":
        return min(n_rows, 4)  # the interpreter: a few programs, each looping over rows
    return max(1, min(n_rows, device_props(device).multi_processor_count * p.programs_per_sm))


def fill_scale_ok(c: float) -> bool:
    """Whether the fill kernel takes c = scale * log2(e): finite and nonzero (at c = 0 or +-inf the fill's
    (fill - r) * c would be NaN, and so would (x - r) * c at the max for infinite c)."""
    return math.isfinite(c) and c != 0.0



def _ring_shape(y2: torch.Tensor, p: Plan) -> tuple[int, int, int]:
    """(elements per 16-byte vector, chunk length, chunks per program and row) of the ring path: chunks
    of half a row, each a y and a dy copy."""
    vec = 16 // y2.element_size()
    chunk = vec * 32 * p.num_warps
    cols = -(-y2.shape[1] // 2)  # columns per program and row
    return vec, chunk, -(-cols // chunk)


def ring_slots(device: torch.device, p: Plan) -> int:
    """Ring slots for this GPU: the plan's, or as many as its shared memory per block holds (1 KB kept
    for the reductions' scratch)."""
    return min(p.slots, _RING_MAX_WAIT, (_smem_per_block(device) - 1024) // (16 * 32 * p.num_warps))


def _hybrid_shape(n_cols: int, p: Plan) -> tuple[int, int, bool]:
    """(16-byte vectors per thread in registers, in shared memory, whether they cover the row exactly)
    of the hybrid path for 16-bit rows of n_cols columns; shared memory <= 0: the registers alone hold
    the row, which the hybrid kernel does not take."""
    threads, n_vec = 32 * p.num_warps, n_cols // 8
    nr = HYBRID_REG_VECS
    ns = -(-(n_vec - nr * threads) // threads)
    return nr, ns, n_vec == (nr + ns) * threads


def gluon_unusable(x2: torch.Tensor, causal: bool, p: Plan, dy2: Optional[torch.Tensor] = None,
                   n_cols: Optional[int] = None, name: Optional[str] = None) -> Optional[str]:
    """Why the plan's Gluon path (hybrid forward; ring backward, with dy2) cannot take these rows (None:
    it can): they are Gluon kernels (GPU only, not in Triton's interpreter), copy 16-byte vectors (rows
    and their stride must be 16-byte aligned) and keep part of a row (hybrid) or half a row of y and of
    dy (ring) in shared memory. n_cols: the columns one hybrid program holds, if not a whole row (the
    cross-entropy's slices); name: the path's name in the reasons."""
    name = name or ("the ring path" if p.ring else "the hybrid path")
    if causal:
        return f"{name} does not take causal rows"
    if GLUON_ERROR:
        return GLUON_ERROR
    if not x2.is_cuda:
        return f"{name} runs on a GPU only (not in Triton's interpreter)"
    props = device_props(x2.device)  # (asked once per device, not every call)
    if (props.major, props.minor) < (8, 0):
        return f"{name} needs cp.async (compute capability 8.0 or newer)"
    vec = 16 // x2.element_size()
    for t in (x2,) if dy2 is None else (x2, dy2):
        if t.stride(1) != 1 or t.shape[1] % vec or t.stride(0) % vec or t.data_ptr() % 16:
            return f"{name} needs 16-byte aligned rows (column count and row stride multiples of 16 bytes)"
    if x2.element_size() != 2:
        return f"{name} takes 16-bit rows"
    if p.ring:
        slots = 2 * _ring_shape(x2, p)[2]
        if slots > ring_slots(x2.device, p):
            return f"a row of {x2.shape[1]} columns does not fit in this GPU's shared memory as {slots} ring slots"
    else:
        ns = _hybrid_shape(x2.shape[1] if n_cols is None else n_cols, p)[1]
        if ns <= 0:
            return f"{name} takes rows longer than the part its registers hold"
        smem, need = _smem_per_block(x2.device), ns * 16 * 32 * p.num_warps
        if need > smem - 1024:
            return f"{name}'s {need // 1024} KB of shared memory per row exceed this GPU's {smem // 1024} KB"
    return None



def ring_pairs(n_rows: int, device: torch.device, p: Plan) -> int:
    """Program pairs of the ring backward: one per row, at most one program per SM (partners must be
    resident at once)."""
    return max(1, _persistent_grid(2 * n_rows, device, p) // 2)

