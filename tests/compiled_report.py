"""What the Gluon compile tests read off a kernel compiled for sm_90 (in their subprocesses, without
TRITON_INTERPRET): its shared memory, PTX, the constant offsets it adds to the start of shared memory
(where the inline cp.async addresses its buffer), and ptxas's resource usage and SASS (cuobjdump, as
Triton ships it; empty where it is missing)."""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path


def report(k, sass: bool = False) -> dict:
    """k: a ``triton.compile`` result; sass: also its SASS (about 0.7 s a kernel), else ""."""
    import triton

    usage = text = ""
    cuobjdump = Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
    if cuobjdump.exists():
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(k.asm["cubin"])
            f.flush()
            usage = subprocess.run([str(cuobjdump), "-res-usage", f.name], capture_output=True, text=True).stdout
            if sass:
                text = subprocess.run([str(cuobjdump), "-sass", f.name], capture_output=True, text=True).stdout
    return {"offsets": [int(o) for o in re.findall(r"@global_smem, i32 (\d+)\)", k.asm["llir"])],
            "shared": k.metadata.shared, "ptx": k.asm["ptx"], "usage": usage, "sass": text}


def compile_gluon_sm90(fn, sig: dict, const: dict, divisible: tuple, warps: int, maxnreg: int):
    """A Gluon row kernel compiled for Hopper (sm_90): ``sig`` its runtime arguments' types, ``const`` its
    constexprs, the arguments at positions ``divisible`` 16-byte aligned, ``warps`` warps within
    ``maxnreg`` registers. Returns the ``triton.compile`` result (for ``report``)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    src = GluonASTSource(fn=fn, signature={**sig, **{k: "constexpr" for k in const}},
                         attrs={(i,): [["tt.divisibility", 16]] for i in divisible}, constexprs=const)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "maxnreg": maxnreg})


def compile_run(args: list[str], timeout: int = 900) -> subprocess.CompletedProcess:
    """``python *args`` for compiling to a GPU target: in a subprocess without TRITON_INTERPRET, with the
    repository importable; the Python of HARNESS_COMPILE_PYTHON where set (e.g. a venv with another
    Triton)."""
    import os
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
    python = os.environ.get("HARNESS_COMPILE_PYTHON") or sys.executable
    return subprocess.run([python, *args], capture_output=True, text=True, env=env, timeout=timeout)


def compile_cases(script: str, cases: list[str], timeout: int = 900) -> list[dict]:
    """Run a compile script (its cases as arguments; it prints one JSON line per case, ``report(k)`` and
    ``case`` among them) through ``compile_run``. The results, in order."""
    import json

    run = compile_run(["-c", script, *cases], timeout)
    assert run.returncode == 0, run.stderr[-3000:]
    results = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert [r["case"] for r in results] == cases
    return results


def check_hybrid_layout(r: dict, warps: int, grad: bool, maxnreg: int) -> None:
    """What a compiled hybrid-style row kernel (part of a row in registers, the rest copied by cp.async
    into a shared buffer at offset 0, ``r["ns"]`` 16-byte slots a thread) must show: the buffer within
    the kernel's shared memory and at its start (constant offsets below its end are slots with the
    gradient, a reduction's scratch past it), vector stores exactly with the gradient, nothing in local
    memory, registers within maxnreg, and a pointer or two on the stack at 8 warps (the plans'), a few
    spilled words at most at 16 (64 registers; Triton 3.6 spills 104 bytes of the hybrid kernel there)."""
    slot = 16 * 32 * warps
    buffer = r["ns"] * slot
    case = r["case"]
    assert buffer <= r["shared"], case
    assert any(o >= buffer for o in r["offsets"]), (case, r["offsets"])  # the first reduction's scratch
    if grad:  # (without it the buffer dies after pass 2, and the last reduction's scratch may reuse it,
        # behind the barrier Triton puts before a write over what was read)
        assert all(o % slot == 0 for o in r["offsets"] if o < buffer), (case, r["offsets"])
    assert "cp.async.cg.shared.global" in r["ptx"] and "cp.async.wait_group 0;" in r["ptx"], case
    assert ("st.global.v4" in r["ptx"]) == grad, case
    if r["usage"]:
        u = r["usage"]
        assert re.search(r"LOCAL:0\b", u), (case, u)
        assert int(re.search(r"REG:(\d+)", u).group(1)) <= maxnreg, (case, u)
        assert int(re.search(r"STACK:(\d+)", u).group(1)) <= (16 if warps == 8 else 128), (case, u)
