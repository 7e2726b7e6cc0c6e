"""The training harness: Hydra apps (train, study), benchmarks, throughput, reliability.

Importing it makes sure ``import kernels`` finds this project's ``kernels/``, the sibling of this package:
Hugging Face's ``kernels`` package (a dependency of transformers 5, the ``hf`` extra) has the same
top-level name and sits in site-packages, which Python searches before an editable install's finder,
so ``harness-train`` run outside the checkout would otherwise get theirs. Where the checkout's
``kernels/`` is there and another would be found first, the checkout goes first on sys.path; where
another ``kernels`` is already imported, the import fails saying why.
"""

import importlib.util
import sys
from pathlib import Path

_OURS = Path(__file__).resolve().parent.parent / "kernels"


def _found_kernels() -> Path | None:
    """The directory ``import kernels`` would load (None: none is found)."""
    loaded = sys.modules.get("kernels")
    origin = getattr(loaded, "__file__", None) if loaded is not None else None
    if origin is None and loaded is None:
        spec = importlib.util.find_spec("kernels")
        origin = spec.origin if spec is not None else None
    return Path(origin).resolve().parent if origin else None


if (_OURS / "__init__.py").is_file() and _found_kernels() != _OURS:
    if "kernels" in sys.modules:
        raise ImportError(f"another package named kernels is already imported ({_found_kernels()}), not this project's "
                          f"({_OURS}): Hugging Face's kernels (a dependency of transformers) has the same name; import "
                          "harness first, or run from the checkout's root")
    sys.path.insert(0, str(_OURS.parent))
