"""`triton`: fused Triton kernels for both of the model's softmaxes, forward and backward, any row length:
the attention's softmax (scale + causal mask + softmax) and the loss's (the cross-entropy over the
vocabulary, with the gradient written by the forward; the chunked linear cross-entropy on it).

One subpackage per op, each with its kernels, its launches (host-side plans beside them) and its torch
ops; each lists its code paths, the bytes they move and its modules in its own docstring:

* ``softmax/``: the softmax. Code paths by row length, dtype and direction: tile (and its fill variant
  for causal forward rows), persistent tile, split, long (streaming); on a GPU, for long 16-bit rows, the
  Gluon hybrid forward and ring backward. Launch tables measured on an H200.
* ``cross_entropy/``: the cross-entropy. Code paths by vocabulary size: tile, split, stream; on a GPU,
  for long 16-bit rows, the Gluon hybrid and slices paths. The linear cross-entropy
  (``cross_entropy/linear.py``) runs the chunk loop every chunking method shares (:mod:`kernels.linear_ce`)
  on these kernels.

The cross-entropy's Gluon paths and its split path reuse the softmax's pieces (the hybrid row's
copies and packing, the split path's chunk exchange), so ``cross_entropy`` imports from ``softmax``,
never the reverse. What is not one op's lives outside the method, in :mod:`kernels.runtime`: whether
Triton can run here (``availability``), the direct launch path (``fastlaunch``) and the device's
properties (``device``). The tools that tune the kernels (the launch-table sweeps) live in
``harness/bench/tuning/``: ``python -m harness.bench triton-sweep`` and ``triton-ce-sweep``.
"""

from __future__ import annotations

from kernels.methods.triton.softmax import triton_softmax, validate
from kernels.registry import Method, register
from kernels.runtime.availability import triton, unavailable_reason

if triton is not None:
    from kernels.methods.triton.cross_entropy import triton_cross_entropy, triton_linear_cross_entropy
else:  # pragma: no cover - the method is unavailable without triton
    triton_cross_entropy = triton_linear_cross_entropy = None

register(
    Method(
        name="triton",
        softmax=triton_softmax,
        cross_entropy=triton_cross_entropy,
        linear_cross_entropy=triton_linear_cross_entropy,
        summary="fused Triton kernels: scale + causal mask + softmax, and the cross-entropy (chunked linear "
                "cross-entropy too) with the gradient written by the forward; forward and backward, any N",
        unavailable_reason=unavailable_reason,
        validate=validate,
    )
)
