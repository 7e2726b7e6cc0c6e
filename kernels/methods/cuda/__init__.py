"""`cuda`: fused scale + causal mask + softmax as a CUDA C++ extension, forward and backward.

The kernels (``csrc/softmax/``, no torch header) pick a code path by row length and alignment: the
code paths are listed in ``csrc/softmax/paths.cuh``; the launch table that picks them is
``csrc/softmax_kernels.cu``, measured with ``python -m harness.bench cuda-sweep`` (:mod:`.sweep`).
``csrc/softmax_binding.cpp`` registers the ops ``softmax_harness_cuda::softmax_fwd`` / ``softmax_bwd``
with ``TORCH_LIBRARY``; :mod:`.op` registers their fake implementations and autograd, so
``torch.compile(fullgraph=True)`` traces through them and ``torch.library.opcheck`` passes.
:mod:`.build` builds the extension on first use (or ``prepare()``); without a GPU, nvcc or ninja the
method reports itself unavailable with the reason.
"""

from __future__ import annotations

from kernels.methods.cuda.build import prepare, unavailable_reason
from kernels.methods.cuda.op import code_path, cuda_softmax, validate
from kernels.registry import Method, register

__all__ = ["code_path", "cuda_softmax", "prepare", "unavailable_reason", "validate"]

register(
    Method(
        name="cuda",
        softmax=cuda_softmax,
        summary="fused CUDA C++ extension: scale + causal mask + softmax, forward and backward, any N",
        unavailable_reason=unavailable_reason,
        validate=validate,
        prepare=prepare,
    )
)
