"""`cuda`: fused scale + causal mask + softmax as a CUDA C++ extension, forward and backward, and a fused
cross-entropy (``cross_entropy``, ``linear_cross_entropy``: :mod:`.cross_entropy`).

The kernels (``csrc/softmax/``, no torch header) pick a code path by row length and alignment: the
code paths are listed in ``csrc/softmax/paths.cuh``; the launch table that picks them is
``csrc/softmax_kernels.cu``, measured with ``python -m harness.bench cuda-sweep``
(``harness/bench/tuning/cuda_sweep.py``).
``csrc/softmax_binding.cpp`` registers the ops ``softmax_harness_cuda::softmax_fwd`` / ``softmax_bwd``
with ``TORCH_LIBRARY``; :mod:`.op` registers their fake implementations and autograd, so
``torch.compile(fullgraph=True)`` traces through them and ``torch.library.opcheck`` passes.
:mod:`.build` builds the extension on first use (or ``prepare()``, in :mod:`.op`); without a GPU, nvcc
or ninja the method reports itself unavailable with the reason.

The cross-entropy (:mod:`.cross_entropy`): the primitives ``softmax_harness_cuda::ce_rows`` and
``scale_grad_`` (``csrc/cross_entropy_binding.cpp``; code paths: ``csrc/cross_entropy/paths.cuh``, launch
table: ``csrc/cross_entropy_kernels.cu``, measured with ``python -m harness.bench cuda-ce-sweep``), and the
method-agnostic drivers of :mod:`.ce_driver` on them (the linear one's chunk loop: :mod:`kernels.linear_ce`).
"""

from __future__ import annotations

from kernels.methods.cuda.build import unavailable_reason
from kernels.methods.cuda.cross_entropy import (ce_code_path, check_targets, cuda_cross_entropy,
                                                cuda_linear_cross_entropy)
from kernels.methods.cuda.op import code_path, cuda_softmax, prepare, validate
from kernels.registry import Method, register

__all__ = ["ce_code_path", "check_targets", "code_path", "cuda_cross_entropy", "cuda_linear_cross_entropy",
           "cuda_softmax", "prepare", "unavailable_reason", "validate"]

register(
    Method(
        name="cuda",
        softmax=cuda_softmax,
        cross_entropy=cuda_cross_entropy,
        linear_cross_entropy=cuda_linear_cross_entropy,
        summary="fused CUDA C++ extension: scale + causal mask + softmax, forward and backward, any N; "
        "fused (linear) cross-entropy, the gradient in the forward, any V",
        unavailable_reason=unavailable_reason,
        validate=validate,
        prepare=prepare,
    )
)
