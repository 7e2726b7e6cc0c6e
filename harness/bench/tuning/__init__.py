"""The tuning tools: how the kernels' launch tables were chosen and what a plan compiles to. They time
or compile candidates of the kernels in ``kernels/methods/``; the kernels never import them. Each is a
command of ``python -m harness.bench`` (the table in :mod:`harness.bench`):

* ``triton-sweep`` (``triton_sweep``): the Triton softmax's launch settings per row length (the tables in
  ``kernels/methods/triton/softmax/plan.py``);
* ``triton-ce-sweep`` (``triton_ce_sweep``): the Triton cross-entropy's plans per vocabulary size
  (``kernels/methods/triton/cross_entropy/launch.py``);
* ``cuda-sweep`` (``cuda_sweep``): the CUDA softmax's launch variants per row length (the table in
  ``csrc/softmax_kernels.cu``);
* ``cuda-ce-sweep`` (``cuda_ce_sweep``): the CUDA cross-entropy's launch variants per vocabulary size
  (``csrc/cross_entropy_kernels.cu``);
* ``flash-sweep`` (``flash_sweep``): the flash attention's launch plans per shape
  (``kernels/methods/flash/plan.py``);
* ``flash-compile-check`` (``flash_compile_check``): the flash kernels compiled for a GPU target without a
  GPU (registers, spills, shared memory, what the plan compiles to).

``traffic`` holds the causal forward's memory floor (a Triton kernel that moves a fused causal softmax's
bytes and computes nothing), which the softmax table (``harness.bench kernels``) reports beside the
methods. Every tool knows nothing of Lightning, Hydra or W&B.
"""
