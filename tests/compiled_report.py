"""What the Gluon compile tests read off a kernel compiled for sm_90 (in their subprocesses, without
TRITON_INTERPRET): its shared memory, PTX, the constant offsets it adds to the start of shared memory
(where the inline cp.async addresses its buffer) and ptxas's resource usage (cuobjdump, as Triton
ships it; empty where it is missing)."""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path


def report(k) -> dict:
    """k: a ``triton.compile`` result."""
    import triton

    usage = ""
    cuobjdump = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
    if cuobjdump.exists():
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(k.asm["cubin"])
            f.flush()
            usage = subprocess.run([str(cuobjdump), "-res-usage", f.name], capture_output=True, text=True).stdout
    return {"offsets": [int(o) for o in re.findall(r"@global_smem, i32 (\d+)\)", k.asm["llir"])],
            "shared": k.metadata.shared, "ptx": k.asm["ptx"], "usage": usage}
