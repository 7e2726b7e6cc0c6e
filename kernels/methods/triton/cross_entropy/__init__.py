"""The ``triton`` method's cross-entropy: the loss softmax over the vocabulary, forward and backward in one
pass, and the chunked linear cross-entropy on it.

Algorithm. Logits (N, V), any strides, targets (N,). One kernel reads each row once, on chip in fp32:
max m, sum s of exp(x - m), the target's logit x_t (a sum of the registers selected by the target's
column, never re-read from memory, so the kernel may write its gradient over its own input; a tuple
``tl.reduce`` could fuse it with the max on a GPU, but the interpreter runs those element by element),
loss = (m - x_t) + log s (0 where the target is ``ignore_index``). When the logits require grad the
same kernel writes the gradient c * (softmax - onehot) in the logits' dtype, c = 1 / n_valid for
'mean' (n_valid counted on the device and read by the kernel through a pointer: no host sync), 1 for
'sum' and 'none', 0 on ignored rows. The backward then only multiplies by grad_output
(``reduction._scale_kernel``): each program reads grad_output from device memory and does nothing when it is
exactly 1 (the usual ``loss.backward()``), else scales the saved gradient in place (per row for
'none'). (Under torch.compile the backward recomputes the gradient instead, grad_output folded in:
see :mod:`.op`.) float16 keeps the gradient unscaled (c = 1) and
divides by n_valid in the backward: 1 / n_valid in fp16 pushes small probabilities into subnormals or
to zero before a GradScaler's factor could lift them.

Code paths by V (``launch.plan``; the long rows' path and chunk from the H200 sweep, ``python -m
harness.bench triton-ce-sweep``; the tile rows from the softmax forward's table):

* Tile (V <= ``TILE_MAX_N``): ROWS whole rows per program in registers (several rows per program for
  short rows). One read, one write per element.
* Split (``LONG_PATH = "split"``, V up to ``MAX_SPLITS`` chunks of ``SPLIT_BLOCK_N``; measured slower
  than stream on the H200, 0.35-0.53 of copy at V = 50304-262144, so not the default: its programs
  wait on each other holding their chunks): a row over several programs, each holding
  one chunk in registers. Each publishes its chunk's (max, sum of exp) to a workspace, bumps the row's
  arrival counter and waits for the row's other chunks, then combines the partials and writes its
  chunk's gradient; the chunk that holds the target writes the row's loss (the target logit never
  leaves its program). No deadlock: chunks take tickets from an atomic counter, so a row's chunks
  start in order and a waiting program only waits for programs that are already running (a row needs
  at most MAX_SPLITS resident programs). Triton's CPU interpreter runs programs one after another, so
  there the kernel runs as two launches (partials, then outputs). One read, one write per element.
* Stream (rows longer than TILE_MAX_N that the hybrid and slices paths cannot take, no cap): one
  program per row, an online pass (running max and rescaled sum per lane) and a gradient pass walking
  the row backwards, so the chunks read last by the first pass are still in L2. Reads the logits twice:
  0.59-0.63 of copy on the H200 (V = 50304-262144).
* Hybrid (the default for 16-bit rows of 16385-65536 columns, 16-byte aligned, on a GPU; else the
  stream path): one Gluon program of 8 warps per row, part of the row in registers, the rest in shared
  memory (:mod:`.gluon`, the softmax's hybrid forward turned into this row kernel). One
  read, one write: 0.95 of copy at V = 50304 (0.824 ms for 16384 rows), 0.95-0.97 at 65536 (H200).
* Slices (the default for 16-bit rows of more than 65536 columns, a multiple of 8, up to
  ``MAX_SLICES`` x 65536, 16-byte aligned, on a GPU; else the stream path): a row cut into S =
  ceil(V / 65536) slices of about V / S columns, one Gluon program of 8 warps per slice holding it as
  the hybrid path holds a row, the slices of a row trading (max, sum of exp) through a workspace and an
  arrival counter as the split path's chunks (tickets, no deadlock) (:mod:`.slices`).
  One read, one write: 0.83 of copy at V = 128256 and 262144 (H200: 1.144 ms for 7680 rows of 128256;
  more slices or 16 warps measured slower, 0.65-0.76).

Bytes (N x V logits of b bytes; H200 device-to-device copy ~4.2 TB/s): forward with gradient reads
N V b and writes N V b (the ideal: 16384 x 50304 bf16 is 3.3 GB, 0.78 ms, against 3.16 ms for
F.cross_entropy on bf16 logits and 2.16 ms for Liger; the tile path should reach 0.85-0.9 of copy;
the stream path reads twice, measured 1.24 ms there, 0.63 of copy); without
gradient it only reads. Backward: ~0 bytes when grad_output is 1 (one launch of 4 programs per SM
that each read one float and return), else 2 N V b (0.78 ms at that size). Compiled: forward N V b
(read only), backward 2 N V b. Small extra launches: the target count and range check (N x 8 bytes,
one program, ``_targets_kernel``), the loss reduction (N x 4, one program, 'mean'/'sum'; a copy for
'none'), a zeroed counter for the split path (the slices path's counters are a cached buffer its
kernel leaves zeroed: no memset) and 8 bytes of partials per chunk or slice. No host-device sync
anywhere on the path.

Modules (kernels, then their launches, then the ops):

* ``kernels``: the ``@triton.jit`` row kernels of the tile, split and stream paths;
* ``gluon``: the hybrid path's Gluon kernel (and the passes the slices path shares); ``slices``: the
  slices path's;
* ``reduction``: the kernels around the row kernels (target count, loss reduction, the backward's scale);
* ``launch``: the path constants, ``Plan`` and ``plan`` (by V), ``launch_ce`` (one pass over the rows:
  loss rows and gradient) and the forward and recomputed gradient the ops call;
* ``op``: the torch ops and ``triton_cross_entropy``, the method's cross-entropy;
* ``linear``: ``triton_linear_cross_entropy``, the chunked linear cross-entropy (the chunk loop:
  :mod:`kernels.linear_ce`).
"""

from __future__ import annotations

from kernels.methods.triton.cross_entropy.linear import triton_linear_cross_entropy
from kernels.methods.triton.cross_entropy.op import triton_cross_entropy

__all__ = ["triton_cross_entropy", "triton_linear_cross_entropy"]
