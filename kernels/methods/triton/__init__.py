"""The Triton method's kernels, one module per op."""
