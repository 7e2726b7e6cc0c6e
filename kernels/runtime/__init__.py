"""The GPU-kernel runtime the methods share: what a method's kernels need beyond their own code, kept
outside every method so that any method (``triton``, ``flash``, a new one) and the benchmarks use it.

* ``availability``: whether Triton (and Gluon) import and Triton kernels can run here (a GPU, or Triton's
  CPU interpreter), and the check that turns away a tensor they cannot take;
* ``fastlaunch``: the direct launch path of compiled Triton kernels (a specialization key computed as
  Triton's ``JITFunction.run`` does, the compiled kernel's launcher called with it; the plain
  ``kernel[grid]`` otherwise), prepared launches (``prepare``, ``Prepared``, ``SiteCache``: a launch whose
  key is known, called with new tensors) and ``cdiv`` for grids; ``run_source``: which Triton
  ``JITFunction.run`` sources the direct path stands in for;
* ``device``: the GPU's properties, asked once per device.

Importing this package or any of its modules registers no method (the registry is filled by
``kernels.methods``). Modules are imported by name (``from kernels.runtime import fastlaunch``).
"""
