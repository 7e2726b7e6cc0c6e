"""The ``triton`` method's softmax: fused scale + causal mask + softmax in Triton, forward and backward, any
row length.

Algorithm. The input is viewed as rows x N (any leading shape; rows may have any stride, columns any
stride; when the leading dims cannot be flattened into one row stride, one copy is made, see below).
For causal scores of shape (..., Tq, Tk), row r is query i = r mod Tq and keeps its first
``min(N, max(0, i + 1 + Tk - Tq))`` keys: only that prefix is loaded; zeros are written after it.

* Tile path (N up to ``MAX_TILE_N``): a program holds ROWS whole rows in registers (several rows per
  program when N is short, so short rows do not underuse the GPU). Forward reads each element once and
  writes it once: max, exp2, sum and the normalisation happen on chip, in fp32. For 16-bit rows of
  16K-32K columns (backward; forward where the hybrid path below cannot run) the persistent variant:
  one program per SM loops over rows, and Triton's software
  pipelining prefetches the next rows into shared memory (cp.async) while this one is reduced, so the
  one long row an SM holds does not leave its memory pipe idle between rows. Causal forward rows take
  the fill variant (``_fwd_fill_kernel``): masked columns are read as -inf keys, so the max, the
  exponentials, the sum and the stores need no per-element mask (about 30% fewer instructions; the
  tile kernel still takes scales the fill cannot, 0 and non-finite ones). The backward tile's
  ``Plan.reload`` reads y and dy a second time (from L1) for dx instead of holding the widened row across
  the row's reduction: at 16384 columns on 16 warps 44 registers a thread instead of 87 (Triton 3.6,
  sm_90), two programs per SM instead of one, as Liger's kernel (16-bit registers) gets. ``Plan.narrow``
  gets there without the second read: y and dy are held as loaded (16-bit) and widened again for dx (51
  registers at 16384, 32 at 8192, 60 without a spill at 32768 on 32 warps, where the held row spills);
  the persistent backward takes it too (its widened row spills 40 bytes at 32768, the narrow one none).
  Both in the sweep's candidates; in no table entry until timed on the GPU.
* Hybrid path (forward, 16-bit rows of ``HYBRID_MIN_N`` + 1 up to ``RING_MAX_N`` columns, not causal,
  on a GPU): a Gluon kernel (Triton's lower-level dialect: explicit layouts and shared memory), one
  program per row, keeps the row's first ``HYBRID_MIN_N`` columns in registers as packed 32-bit words
  (two elements each, converted to fp32 again in each pass) and copies the rest into shared memory
  with asynchronous copies (cp.async). A 64K-column row then takes 32 KB of registers and 96 KB of
  shared memory, so two programs (two rows) fit an SM and one's reductions overlap the other's loads
  and stores, which one program per SM looping over rows could not do; one read and one write per
  element.
* Ring path (backward, 16-bit rows of ``MAX_TILE_N`` + 1 up to ``RING_MAX_N`` columns, not causal, on a
  GPU): y and dy of such a row do not fit one SM, so a Gluon kernel splits each row over a pair of
  programs (one per SM), each streaming its half of its rows as chunks through a ring of shared-memory
  slots (cp.async), the next rows' chunks in flight while this row is reduced; the pair trades its
  halves' partial sum(dy * y) through one atomic per row. Rows the Gluon paths cannot take (not 16-byte
  aligned; Triton's interpreter) get the plan below them.
* Split path (N above ``SPLIT_ABOVE_N``, at most ``MAX_SPLITS`` chunks): a row is cut into chunks of
  BLOCK_N columns, one program per chunk, each holding its chunk in registers (small programs, several
  per SM, where one program per long row would leave one row in flight per SM). Each program publishes
  its chunk's (max, sum) to a workspace, bumps the row's arrival counter and waits until every chunk of
  the row has arrived, then combines the partials and writes its chunk: still one read and one write
  per element. No deadlock: programs take their chunk from a ticket counter (an atomic), so the chunks
  of a row start in order and a waiting program only waits for programs that are already running (a row
  needs at most ``MAX_SPLITS`` programs resident at once, far fewer than a GPU holds). Triton's CPU
  interpreter runs programs one after another, so there the same kernel runs as two launches (partials
  first, then outputs) instead of waiting.
* Long path (beyond the split path, no upper limit): one program per row streams it in chunks twice:
  an online pass (running max and rescaled sum per lane) and a normalising pass that walks the row
  backwards, so the chunks it reads first are the ones the first pass loaded last and are still in
  L1/L2; the first pass asks the cache to keep the row (evict_last), the second lets it go.
* Backward, one kernel: dx = scale * y * (dy - sum(dy * y)); reads y and dy (only the unmasked prefix)
  and writes dx; only y is saved for backward, never the input.

Bytes moved (tile path): forward 2 x tensor bytes (read x, write y), backward 3 x (read y, dy, write
dx); causal rows read about half. It should run near the device-to-device copy bandwidth. Launch
settings come from tables measured on an H200 (by row length; causal rows have their own) in ``plan``,
with heuristics outside them; never autotuned inside a step.

Registered as the torch ops ``softmax_harness::triton_softmax_fwd`` / ``_bwd`` (``torch.library.custom_op``
with fake implementations and autograd), so ``torch.compile(fullgraph=True)`` traces a model that uses
it without a graph break. Inputs: CUDA tensors (or CPU tensors under ``TRITON_INTERPRET=1``, Triton's
interpreter, for tests), float32/float16/bfloat16, a non-empty last dimension.

Modules (host side, then kernels, then what runs them):

* ``plan``: the path constants, ``Plan``, the launch tables and ``plan.plan``, the Gluon paths' shape
  arithmetic and ``gluon_unusable`` (the device's properties: ``kernels.runtime.device``).
* ``tile``: the ``@triton.jit`` kernels of the tile (and fill), persistent, split and long paths.
* ``gluon``: the Gluon kernels of the hybrid forward and the ring backward, with their inline PTX.
* ``launch``: ``launch_fwd`` / ``launch_bwd``: a plan, then that path's kernel, through
  ``kernels.runtime.fastlaunch`` (on a GPU, a compiled kernel's launcher called directly after its first
  ``kernel[grid]`` launch; ``HARNESS_TRITON_DIRECT=0`` turns it off); contiguous inputs' launches kept
  prepared (``fastlaunch.Prepared``) by shape, strides, dtype, device, scale, causality and alignment, so a
  repeated call skips the plan, the row views and the specialization key (the split path, which
  allocates per call, excepted).
* ``op``: the torch ops, ``triton_softmax`` (the method's softmax) and ``validate``.

The launch-table sweep that chose the tables is a tool, not part of the method: ``python -m harness.bench
triton-sweep`` (``harness/bench/tuning/triton_sweep.py``).
"""

from __future__ import annotations

from kernels.methods.triton.softmax.launch import launch_bwd, launch_fwd
from kernels.methods.triton.softmax.op import triton_softmax, triton_softmax_bwd, triton_softmax_fwd, validate
from kernels.methods.triton.softmax.plan import Plan

__all__ = ["Plan", "launch_bwd", "launch_fwd", "triton_softmax", "triton_softmax_bwd", "triton_softmax_fwd",
           "validate"]
