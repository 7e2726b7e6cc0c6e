"""Which ``JITFunction.run`` sources the direct launch path (:mod:`.fastlaunch`) stands in for: the lines of
``run`` it reproduces, the knob reads ``run`` adds to the compile options (so to the cache key), the hooks
that must be unset, and the sources checked line by line against it (Triton 3.6.0, 3.9.0). A Triton whose
``run`` differs takes the plain ``kernel[grid]`` path.
"""

from __future__ import annotations

import hashlib
from typing import Optional

# the lines of JITFunction.run the direct path reproduces (Triton 3.6; 3.9 reads one more knob, below)
_RUN_CALLS = (
    "bound_args, specialization, options = binder(*args, **kwargs)",
    "key = compute_cache_key(kernel_key_cache, specialization, options)",
    "device = driver.active.get_current_device()",
    "stream = driver.active.get_current_stream(device)",
    "for hook in self.pre_run_hooks:",
    "kernel.run(grid_0, grid_1, grid_2, stream, kernel.function, kernel.packed_metadata, launch_metadata,",
    "knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *bound_args.values())",
)
# the knob reads run adds to the compile options (so to the key), by the exact line it reads them in
_KNOB_LINES = {
    'kwargs["debug"] = kwargs.get("debug", self.debug) or knobs.runtime.debug': ("runtime", "debug"),
    'kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode': ("compilation", "instrumentation_mode"),
    'kwargs["fpsan_homomorphic_casts"] = knobs.compilation.fpsan_homomorphic_casts':
        ("compilation", "fpsan_homomorphic_casts"),
}
_MUST_BE_NONE = {"if knobs.runtime.add_stages_inspection_hook is not None:": ("runtime", "add_stages_inspection_hook")}
_GUARDED = {"inspect_stages_key, inspect_stages_hash = knobs.runtime.add_stages_inspection_hook()"}  # (under the above)
#: JITFunction.run sources (sha256 of the stripped non-empty lines) checked line by line against the direct path
KNOWN_RUN_SOURCES = {"b23b098b1d164489": "3.6.0", "40d673d756fa87b1": "3.9.0"}


def source_digest(src: str) -> str:
    lines = "\n".join(ln.strip() for ln in src.splitlines() if ln.strip())
    return hashlib.sha256(lines.encode()).hexdigest()[:16]


def check_run_source(src: str, force: bool = False) -> tuple[Optional[str], tuple, tuple]:
    """(why the direct path cannot stand in for this ``JITFunction.run`` source or None, the knob reads
    it adds to the options, the hooks that must be unset): a source known here (or force),
    every call the direct path reproduces present, every knob it reads known."""
    if not force and source_digest(src) not in KNOWN_RUN_SOURCES:
        return f"JITFunction.run is not a version this module was written against ({source_digest(src)})", (), ()
    lines = [ln.strip() for ln in src.splitlines()]
    for call in _RUN_CALLS:
        if call not in lines:
            return f"JITFunction.run has no line {call!r}", (), ()
    knobs, nones = [], []
    for ln in lines:
        if ln.startswith("kwargs[") or ("knobs." in ln and ln not in _RUN_CALLS):
            if ln in _KNOB_LINES:
                knobs.append(_KNOB_LINES[ln])
            elif ln in _MUST_BE_NONE:
                nones.append(_MUST_BE_NONE[ln])
            elif ln in _GUARDED:
                continue
            else:
                return f"JITFunction.run reads an unknown knob: {ln!r}", (), ()
    return None, tuple(knobs), tuple(nones)
