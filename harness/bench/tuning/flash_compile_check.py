"""Compile the flash kernels for a GPU target without a GPU: ``python -m harness.bench flash-compile-check``.

Runs the real launchers on CPU tensors with the kernels swapped for recorders, then hands each
recorded launch to ``triton.compile`` for the target (sm_90 by default) and prints what ptxas made
of it: registers per thread, spill stack, shared memory, whether the TTGIR has wgmma
(``warp_group_dot``), TMA copies and warp-specialized partitions, and the PTX's atomic instructions
(the atomic dq's adds: how many, and whether vectorized; tma_add's bulk tensor reductions). A plan that spills or does not
fit shared memory shows here before any GPU time is spent; timings come from ``flash-sweep``. Gluon plans
(``gluon=``) compile their Gluon kernels (Hopper's, whatever this machine has).

    python -m harness.bench flash-compile-check --d 64,128 --dtype bfloat16 \\
        --fwd "num_warps=8" --bwd "block_n1=128 tma=host"
    python -m harness.bench flash-compile-check --d 64 --fwd "gluon=2 block_m=128 block_n=128 num_stages=2" \\
        --bwd "gluon=1 block_n1=128 block_m1=64 num_stages=2 dq_mode=tma_add"
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
import types
from typing import Callable

import torch

if os.environ.get("TRITON_INTERPRET", "0") == "1":  # (before Triton is imported, which reads it once)
    raise SystemExit("flash-compile-check compiles for a GPU target: unset TRITON_INTERPRET")

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402

from harness.bench.tuning.flash_sweep import knobs_over, parse_heads  # noqa: E402
from kernels.methods.flash import bwd, bwd_gluon, bwd_gluon_dq, fwd, fwd_gluon, gluon_common  # noqa: E402
from kernels.methods.flash import plan as plans  # noqa: E402
from kernels.methods.flash.tiles import TensorDescriptor  # noqa: E402

_TY = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
#: a launch's compile options among its meta keywords (not kernel parameters), with Triton's defaults where given
_OPTIONS = {"num_warps": 4, "num_stages": 3, "maxnreg": None}


class _Recorder:
    """Stands in for a jitted kernel: ``kernel[grid](*args, **kw)`` records the call."""

    def __init__(self, fn, calls: list):
        self.fn, self.calls = fn, calls

    def __getitem__(self, grid):
        return lambda *args, **kw: self.calls.append((self.fn, args, kw))


def _signature(fn, args, kw):
    params = fn.params
    sig, attrs, consts = {}, {}, {}
    values = dict(zip([p.name for p in params], args))
    values.update({k: v for k, v in kw.items() if k not in _OPTIONS})
    for i, p in enumerate(params):
        a = values[p.name] if p.name in values or not p.has_default else p.default  # (a constexpr left at its default)
        if p.is_constexpr:
            sig[p.name], consts[p.name] = "constexpr", a
        elif isinstance(a, torch.Tensor):
            sig[p.name] = "*" + _TY[a.dtype]
            if a.data_ptr() % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif TensorDescriptor is not None and isinstance(a, TensorDescriptor):
            sig[p.name] = f"tensordesc<{_TY[a.base.dtype]}[{','.join(map(str, a.block_shape))}]>"
        elif gluon_common.GluonDescriptor is not None and isinstance(a, gluon_common.GluonDescriptor):
            sig[p.name] = f"tensordesc<{_TY[a.base.dtype]}[{','.join(map(str, a.block_shape))}],{a.layout}>"
        elif isinstance(a, bool):
            sig[p.name] = "i1"
        elif isinstance(a, int):
            if a == 1:  # Triton specializes an integer argument equal to 1
                sig[p.name], consts[p.name] = "constexpr", 1
            else:
                sig[p.name] = "i32" if abs(a) < 2**31 else "i64"
                if a % 16 == 0:
                    attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(a, float):
            sig[p.name] = "fp32"
        else:
            raise TypeError(f"{fn.__name__}: cannot type argument {p.name}={a!r}")
    return sig, attrs, consts


def compile_call(fn, args, kw, target: GPUTarget) -> dict:
    sig, attrs, consts = _signature(fn, args, kw)
    backend = make_backend(target)
    opts = backend.parse_options({k: kw.get(k, default) for k, default in _OPTIONS.items()})
    source = ASTSource
    if getattr(fn, "is_gluon", lambda: False)():
        # Gluon is experimental and absent from some Triton builds: only a Gluon kernel needs it
        from triton.experimental.gluon._runtime import GluonASTSource as source
    k = triton.compile(source(fn=fn, signature=sig, constexprs=consts, attrs=attrs), target=target,
                       options=opts.__dict__)
    tool = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        usage = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    regs, stack = re.search(r"REG:(\d+)", usage), re.search(r"STACK:(\d+)", usage)
    g = k.asm["ttgir"]
    reds = re.findall(r"\b(?:red|atom)\.global[.\w]*", k.asm["ptx"])  # the atomic dq's adds
    bulk = re.findall(r"\bcp\.reduce\.async\.bulk\.tensor[.\w:]*", k.asm["ptx"])  # tma_add's reductions
    return {"regs": int(regs.group(1)) if regs else -1, "stack": int(stack.group(1)) if stack else -1,
            "smem": k.metadata.shared, "wgmma": "warp_group_dot" in g, "tma": g.count("async_tma_copy"),
            "ws": "ttg.warp_specialize" in g, "atomics": sorted(set(reds + bulk)), "n_atomics": len(reds) + len(bulk),
            "global_loads": len(re.findall(r"\bld\.global", k.asm["ptx"]))}


def record(d: int, dtype: torch.dtype, causal: bool, fplan: plans.FwdPlan, bplan: plans.BwdPlan,
           B: int = 4, H: int = 12, T: int = 1024, kv_heads: int = 0) -> list:
    """The launches the launchers would make for (B, H, T, d) inputs in the model's layout; ``kv_heads``
    (Hkv dividing H; 0: H) key/value heads (grouped-query attention)."""
    calls: list = []
    kernels = [(fwd, "_fwd_kernel"), (bwd, "_bwd_kernel")]
    stubs = [(bwd, "_delta_kernel", _Recorder(bwd._delta_kernel, [])),
             (fwd, "tma_supported", lambda device: True)]  # compiling for sm_90: TMA exists there
    if fwd_gluon.GLUON_ERROR is None:  # (the Gluon kernels' checks of the tensors are for the GPU they run on)
        kernels += [(fwd_gluon, "_fwd_ws_kernel"), (bwd_gluon, "_dkdv_ws_kernel"), (bwd_gluon_dq, "_dq_ws_kernel")]
        # (the inputs' checks as on a Hopper GPU: the device's are for the GPU the kernels run on)
        stubs += [(gluon_common, "supported", gluon_common.inputs_reason),
                  (bwd, "tma_eligible", lambda *tensors: True),
                  # persistent plans: programs as on an H100 / H200 (132 SMs), asked of no GPU here
                  (fwd_gluon, "device_props", lambda device: types.SimpleNamespace(multi_processor_count=132)),
                  (torch.cuda, "current_device", lambda: 0)]
    stubs += [(m, n, _Recorder(getattr(m, n), calls)) for m, n in kernels]
    saved = [(m, n, getattr(m, n)) for m, n, _ in stubs]
    for m, n, stub in stubs:
        setattr(m, n, stub)
    try:
        kv = kv_heads or H
        q, k, v = (torch.empty((B, T, h, d), dtype=dtype).transpose(1, 2) for h in (H, kv, kv))
        out, lse = fwd.launch_fwd(q, k, v, d ** -0.5, causal, fplan)
        bwd.launch_bwd(torch.empty_like(out), q, k, v, out, lse, d ** -0.5, causal, bplan)
    finally:
        for m, n, real in saved:
            setattr(m, n, real)
    return calls


def part_name(fn, kw: dict) -> str:
    """Which kernel of the flash method a recorded launch is."""
    if fn is fwd._fwd_kernel:
        return "forward"
    if fwd_gluon.GLUON_ERROR is None:
        if fn is fwd_gluon._fwd_ws_kernel:
            return "forward (Gluon)"
        if fn is bwd_gluon._dkdv_ws_kernel:
            return "dk/dv + dq (Gluon)" if kw["DQ"] else "dk/dv (Gluon)"
        if fn is bwd_gluon_dq._dq_ws_kernel:
            return "dq (Gluon)"
    return {(True, True): "dk/dv + dq", (True, False): "dk/dv", (False, True): "dq"}[(kw["DO_KV"], kw["DO_Q"])]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--d", default="64,128", help="head dims, comma-separated")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--causal", default="1", choices=("0", "1"))
    p.add_argument("--fwd", default="", help="knob=value ... over the default / table plan")
    p.add_argument("--bwd", default="")
    p.add_argument("--arch", type=int, default=90, help="compute capability (90: H100/H200)")
    p.add_argument("--heads", default="12", help="query heads H, or H:Hkv with Hkv key/value heads dividing H "
                   "(grouped-query attention), e.g. 14:2")
    p.add_argument("--gluon-grouped", action="store_true",
                   help="grouped heads through the Gluon kernels (gluon_common.GROUPED, off until their GPU check; "
                   "without it grouped heads compile the Triton kernels the launchers run)")


def run(a: argparse.Namespace, error: Callable[[str], None]) -> None:
    dtype, causal, target = getattr(torch, a.dtype), a.causal == "1", GPUTarget("cuda", a.arch, 32)
    try:
        heads, kv_heads = parse_heads(a.heads)
    except ValueError as exc:
        error(f"--heads {exc}")
    gluon_common.GROUPED = gluon_common.GROUPED or a.gluon_grouped
    print(f"triton {triton.__version__}, target sm_{a.arch}, {heads} query heads on {kv_heads} key/value heads")
    for d in (int(x) for x in a.d.split(",")):
        f0, b0 = plans.launch_plans(d, d, dtype, causal, 4096, 4096, grouped=kv_heads != heads)
        try:
            fp, bp = knobs_over(f0, a.fwd), knobs_over(b0, a.bwd)
        except ValueError as exc:  # (knobs that make no plan over d's table plan)
            error(f"d={d}: {exc}")
        print(f"d={d}: {fp}\n      {bp}")
        try:
            calls = record(d, dtype, causal, fp, bp, H=heads, kv_heads=kv_heads)
        except ValueError as exc:  # (a plan this head dim cannot take: three consumers at d = 128, 128-key tiles)
            print(f"  not compiled: {exc}")
            continue
        for fn, args, kw in calls:
            part = part_name(fn, kw)
            try:
                r = compile_call(fn, args, kw, target)
                shape = (f"{kw['num_warps']} warps {kw['num_stages']} stages" if "num_stages" in kw else
                         f"{kw['STAGES']} slots")  # (Gluon: 4 warps a partition)
                print(f"  {part:11s} {shape}: {r['regs']} registers, "
                      f"{r['stack']} B spill stack, {r['smem'] / 1024:.0f} KB shared; wgmma {r['wgmma']}, "
                      f"TMA copies {r['tma']}, warp-specialized {r['ws']}"
                      + (f"; {r['n_atomics']} atomic instructions ({', '.join(r['atomics'])})" if r["n_atomics"] else ""))
            except Exception as exc:
                lines = str(exc).strip().splitlines()
                print(f"  {part:11s} FAILED to compile: {type(exc).__name__}: {lines[-1][:200] if lines else ''}")
