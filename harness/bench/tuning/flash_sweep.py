"""Sweep the flash launch plans on a GPU: ``python -m harness.bench flash-sweep``.

For each shape, forward plans are timed alone and backward plans as forward + backward (with the
best forward plan), in phases: each phase tries every combination of its knobs, starting from the
best plan of the phase before (the first from the table's or the default plan). Every candidate is
checked against the float64 reference (``kernels.reference_attention``, on batch 0, query heads 0-1 and
the rest of kv head 0's group) before it is timed; a wrong or failing candidate gets no time. Prints TFLOP/s (forward 4 B H Tq Tk
d, halved for causal Tq = Tk; forward + backward 3.5x that), writes JSON after every candidate, and
prints the winners as ``plan.TABLE`` entries. SDPA's flash and cuDNN backends are timed alongside for
reference (``--no-baselines`` skips them). Knows nothing of Lightning, Hydra or W&B.

    python -m harness.bench flash-sweep --shapes "16,12,1024,64;4,12,4096,64;8,16,2048,128" \\
        --causal 1 --dtype bfloat16 --out flash-sweep.json
    python -m harness.bench flash-sweep --shapes 16,12,1024,64 --mode fwd \\
        --fwd-phases "block_m=64,128 block_n=64,128 | tma=off,host,device | warp_specialize=0,1"
    python -m harness.bench flash-sweep --shapes "8,14:2,2048,64" --mode bwd --bwd-phases "one_loop=0,1"

A shape's H may be ``H:Hkv`` (grouped-query attention: Hkv key/value heads dividing H): the sweep then
starts from the plans the launchers fall back to there (the Triton kernels', two backward passes), checks
every query head of kv head 0's group (its dk and dv sum over them), and times SDPA's flash backend with
``enable_gqa`` beside it (cuDNN refuses grouped heads on torch 2.11: its line says so).

About 2 s a candidate while Triton compiles it (plans of one head dim share compiles across
shapes), then about 0.5 s.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import time
import traceback
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from harness.bench.common import qkv_inputs
from harness.bench.timing import bench_ms, error_on_device
from kernels.methods.flash import plan as plans
from kernels.methods.flash.bwd import launch_bwd
from kernels.methods.flash.fwd import launch_fwd
from kernels.reference import ATTN_BWD_TOL, ATTN_FWD_TOL, reference_attention
from kernels.runtime import availability

#: The default phases (about 98 forward and 113 backward candidates a shape). warp_specialize is left out: Triton 3.6
#: does not specialize these loops on Hopper (flash-compile-check); add "| warp_specialize=0,1" to measure it (on
#: Blackwell, say). The forward's last phase tries the grouped causal program order (FwdPlan.group; left out where
#: not causal, where it changes nothing), then the Triton kernel's register cap (FwdPlan.maxnreg: more programs an
#: SM), then the masked tiles inside the full tiles' loop (FwdPlan.one_loop; the Gluon phases start without it), then
#: the Gluon kernel (FwdPlan.gluon: Hopper only; elsewhere its candidates fail with the reason), a program a work
#: tile or persistent, with and without the softmax under the previous p v (FwdPlan.overlap), then three consumers
#: (block_m=192, persistent; d = 64, or d = 128 with 64-key tiles: elsewhere its candidates fail with the reason),
#: then the best plan's causal order in sections of heads (FwdPlan.section_mb: persistent Gluon plans only, the
#: others are no plan and skipped), then the row sums by the tensor cores (FwdPlan.sum_mma; the Gluon phases start
#: without them, since ping-pong and the overlap take none, and the last phase tries them on the best plan, skipped
#: where it lags). The backward's phases then try delta formed by the dq pass (BwdPlan.delta_in_dq: no delta kernel),
#: dq added by the dk/dv programs (element atomics or TMA reductions, no dq pass), then re-tune the dk/dv tiles for
#: whichever dq mode won, then the masked tiles inside the full tiles' loops (BwdPlan.one_loop; the Gluon phases
#: start without it), then the Gluon dk/dv pass (BwdPlan.gluon; Hopper only) with the Triton dq pass, then adding dq
#: itself (TMA reductions of both consumers' shares, by turns or split by columns: BwdPlan.dq_split), then with the
#: Gluon dq pass (delta formed by the delta kernel or by that pass), then the best plan's Gluon passes waiting for
#: each product only where it is needed next (BwdPlan.overlap; a Triton plan has none: skipped), then the Gluon passes'
#: programs in LPT sections of heads (BwdPlan.lpt_mb; a Triton plan has none: skipped).
FWD_PHASES = ("block_m=64,128 block_n=32,64,128 num_warps=4,8 num_stages=2,3,4 | tma=off,host,device | "
              "group=1,4,8,16 | maxnreg=0,96 | one_loop=0,1 | "
              "gluon=1,2 block_m=128 block_n=64,128 num_stages=2,3 persistent=0,1 overlap=0,1 "
              "tma=off group=1 maxnreg=0 sum_mma=0 one_loop=0 | "
              "gluon=1,2 block_m=192 block_n=64,128 num_stages=2,3,4 persistent=1 overlap=0,1 "
              "tma=off group=1 maxnreg=0 sum_mma=0 one_loop=0 | "
              "section_mb=0,16,32 | sum_mma=0,1")
BWD_PHASES = ("block_m1=32,64 block_n1=64,128 num_warps=4,8 num_stages=2,3,4 | "
              "block_m2=64,128 block_n2=32,64 dq_warps=4,8 dq_stages=2,3,4 | tma=off,host,device | fused=0,1 | "
              "fused=0 delta_in_dq=1 | "
              "fused=0 delta_in_dq=0 dq_mode=pass,atomic,tma_add | "
              "block_m1=32,64 block_n1=64,128 num_warps=4,8 num_stages=2,3,4 | one_loop=0,1 | "
              "gluon=1 block_n1=128 block_m1=32,64 num_stages=2,3 fused=0 dq_mode=pass delta_in_dq=0,1 tma=off | "
              "gluon=1 block_n1=128 block_m1=64 num_stages=2,3 fused=0 dq_mode=tma_add delta_in_dq=0 tma=off "
              "dq_split=0,1 one_loop=0 | "
              "gluon=2 block_n1=128 block_m1=32,64 num_stages=2,3 fused=0 dq_mode=pass delta_in_dq=0,1 tma=off "
              "dq_split=0 one_loop=0 block_m2=128 block_n2=64,128 dq_stages=2,3 | overlap=0,1 | lpt_mb=0,8,16,32")


def parse_phases(text: str, cls) -> list[dict]:
    """'a=1,2 b=x | c=0,1' -> [{'a': [1, 2], 'b': ['x']}, {'c': [False, True]}] (typed by the plan)."""
    types = {f.name: f.type for f in dataclasses.fields(cls)}
    phases = []
    for part in text.split("|"):
        knobs = {}
        for tok in part.split():
            name, _, values = tok.partition("=")
            if name not in types:
                raise SystemExit(f"unknown {cls.__name__} knob {name!r}; knobs: {', '.join(types)}")
            kind = types[name] if isinstance(types[name], str) else types[name].__name__
            conv = {"int": int, "bool": lambda s: s.lower() in ("1", "true", "yes"), "str": str}[kind]
            knobs[name] = [conv(v) for v in values.split(",") if v]
        if knobs:
            phases.append(knobs)
    return phases


def knobs_over(plan, text: str):
    """plan with 'knob=value ...' set over it (one value a knob, no phases; typed as ``parse_phases`` types them):
    what flash_compile_check and scripts/profile_attention.py take. ValueError where the text is phases or several
    values, or the knobs make no plan."""
    phases = parse_phases(text, type(plan))
    if len(phases) > 1 or any(len(v) != 1 for ph in phases for v in ph.values()):
        raise ValueError(f"one value per knob (knob=value ...), no phases; got {text!r}")
    return dataclasses.replace(plan, **{k: v[0] for k, v in (phases[0] if phases else {}).items()})


def flops(B: int, H: int, tq: int, tk: int, d: int, dv: int, causal: bool) -> float:
    """Forward FLOPs: 2 (q k^T) + 2 (p v) per visible (query, key) pair per head dim; causal Tq = Tk
    counts half the square (the anchors' convention), other causal shapes their visible pairs."""
    if not causal:
        pairs = tq * tk
    elif tq == tk:
        pairs = tq * tk / 2
    else:
        off = tk - tq
        pairs = sum(min(tk, max(0, i + 1 + off)) for i in range(tq))
    return 2.0 * B * H * pairs * (d + dv)


class Sweep:
    def __init__(self, args):
        self.args = args
        self.records: list[dict] = []
        self.best: dict[str, dict] = {}
        self.t0 = time.time()
        self.out = Path(args.out)
        if self.out.is_dir():  # (a folder, as the other sweeps and benchmarks take: the file goes inside)
            self.out = self.out / "flash_sweep.json"
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.seen: dict[tuple, float] = {}  # (shape, direction, plan) -> ms, so a later phase does not re-time

    def over_budget(self) -> bool:
        return self.args.max_seconds and time.time() - self.t0 > self.args.max_seconds

    def save(self) -> None:
        meta = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                "torch": torch.__version__, "triton": _triton_version()}
        self.out.write_text(json.dumps({"meta": meta, "results": self.records, "best": self.best}, indent=1))

    def record(self, **rec) -> dict:
        self.records.append(rec)
        self.save()
        return rec

    def run_shape(self, shape: tuple, causal: bool) -> None:
        a = self.args
        B, H, kv, tq, tk, d = shape
        dtype = getattr(torch, a.dtype)
        q, k, v = qkv_inputs(B, H, tq, tk, d, dtype, a.layout, a.device, kv)
        scale = d ** -0.5
        do = torch.randn(q.shape[:-1] + (v.shape[-1],), device=a.device).to(dtype)
        # float64 reference on batch 0, query heads 0-1 and every other query head of kv head 0's group (the
        # outputs and gradients of those heads and of the kv heads they read depend on them alone)
        nq = max(2, H // kv)
        nk = -(-nq // (H // kv))
        sub = [t[:1, :n].detach().double().requires_grad_(True) for t, n in ((q, nq), (k, nk), (v, nk))]
        ref = reference_attention(*sub, scale=scale, causal=causal)
        ref.backward(do[:1, :nq].double())
        refs = [ref.detach()] + [t.grad for t in sub]
        heads = (nq, nq, nk, nk)  # (the output's and the gradients' heads the check reads)
        fl = flops(B, H, tq, tk, d, v.shape[-1], causal)
        tag = f"{B},{H if kv == H else f'{H}:{kv}'},{tq},{tk},{d}/{'causal' if causal else 'full'}/{a.dtype}"
        fplan, bplan = plans.launch_plans(d, v.shape[-1], dtype, causal, tq, tk, grouped=kv != H)
        print(f"\n== {tag}: {fl / 1e9:.1f} GFLOP forward; start {fplan} / {bplan}")
        if not a.no_baselines:
            self.baselines(tag, q, k, v, do, scale, causal, fl)

        def check_fwd(fp):
            out, _ = launch_fwd(q, k, v, scale, causal, fp)
            err = error_on_device(out[:1, :heads[0]], refs[0])
            return err, err <= ATTN_FWD_TOL[dtype]

        def check_bwd(bp):
            out, lse = launch_fwd(q, k, v, scale, causal, fplan)
            grads = launch_bwd(do, q, k, v, out, lse, scale, causal, bp)
            errs = [error_on_device(g[:1, :n], r) for g, r, n in zip(grads, refs[1:], heads[1:])]
            return max(errs), max(errs) <= ATTN_BWD_TOL[dtype]

        if a.mode in ("fwd", "both"):
            fwd_phases = parse_phases(a.fwd_phases, plans.FwdPlan)
            if not causal:  # the program order (group) is a causal knob: the same launch otherwise
                fwd_phases = [ph for ph in ({n: vs for n, vs in ph.items() if n != "group"} for ph in fwd_phases) if ph]
            fplan = self.phases(tag, "fwd", fplan, fwd_phases, check_fwd,
                                lambda fp: (lambda: launch_fwd(q, k, v, scale, causal, fp)), fl)
        if a.mode in ("bwd", "both"):
            def fwd_bwd(bp):
                return lambda: launch_bwd(do, q, k, v, *launch_fwd(q, k, v, scale, causal, fplan), scale, causal, bp)
            bplan = self.phases(tag, "fwd+bwd", bplan, parse_phases(a.bwd_phases, plans.BwdPlan), check_bwd,
                                fwd_bwd, 3.5 * fl)
        d_pad = plans.head_pad(max(d, v.shape[-1]))
        grouped = "" if kv == H else "  (grouped heads: the table has no grouped entries; the launchers take plan.launch_plans')"
        print(f"table entry: ({d_pad}, {a.dtype!r}, {causal}): (({max(tq, tk)}, {fplan}, {bplan}),),{grouped}")
        self.best[tag] = {"fwd": dataclasses.asdict(fplan), "bwd": dataclasses.asdict(bplan),
                          "table_key": [d_pad, a.dtype, causal], "max_t": max(tq, tk)}
        self.save()

    def phases(self, tag, direction, base, phases, check, make_fn, fl):
        best, best_ms = base, None
        for i, knobs in enumerate(phases):
            start = best
            names = list(knobs)
            for values in itertools.product(*(knobs[n] for n in names)):
                if self.over_budget():
                    print(f"  time budget of {self.args.max_seconds} s spent: stopping")
                    return best
                try:
                    cand = dataclasses.replace(start, **dict(zip(names, values)))
                except ValueError:  # not a valid plan (a block below 16, ...)
                    continue
                if (tag, direction, cand) in self.seen:
                    continue
                self.seen[(tag, direction, cand)] = float("nan")
                rec = {"shape": tag, "direction": direction, "phase": i, "plan": dataclasses.asdict(cand)}
                try:
                    err, ok = check(cand)
                    rec["error"] = err
                    if not ok:
                        self.record(**rec, status="wrong")
                        print(f"  WRONG {err:.2e}  {cand}")
                        continue
                    ms = bench_ms(make_fn(cand), self.args.rep_ms)
                except Exception as exc:  # a plan that does not compile or launch (shared memory, ...)
                    self.record(**rec, status="failed", reason=f"{type(exc).__name__}: {str(exc)[:300]}")
                    print(f"  FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}  {cand}")
                    if self.args.verbose:
                        traceback.print_exc()
                    continue
                tflops = fl / (ms * 1e-3) / 1e12
                self.record(**rec, status="ok", ms=ms, tflops=tflops)
                mark = ""
                if best_ms is None or ms < best_ms:
                    best, best_ms, mark = cand, ms, "  *"
                print(f"  {direction:8s} {ms:8.3f} ms {tflops:7.1f} TFLOP/s  err {err:.1e}  {cand}{mark}")
        return best

    def baselines(self, tag, q, k, v, do, scale, causal, fl) -> None:
        if q.shape[2] != k.shape[2] or not torch.cuda.is_available():
            return
        for name, backend in (("sdpa-flash", SDPBackend.FLASH_ATTENTION), ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION)):
            qq, kk, vv = (t.detach().requires_grad_(True) for t in (q, k, v))

            def fwd():
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal, scale=scale,
                                                          enable_gqa=kk.shape[1] != qq.shape[1])

            def fwd_bwd():
                torch.autograd.grad(fwd(), (qq, kk, vv), do)

            try:
                for direction, fn, f in (("fwd", fwd, fl), ("fwd+bwd", fwd_bwd, 3.5 * fl)):
                    ms = bench_ms(fn, self.args.rep_ms)
                    self.record(shape=tag, direction=direction, baseline=name, status="ok", ms=ms,
                                tflops=f / (ms * 1e-3) / 1e12)
                    print(f"  {name:10s} {direction:8s} {ms:8.3f} ms {f / (ms * 1e-3) / 1e12:7.1f} TFLOP/s")
            except Exception as exc:
                print(f"  {name}: {type(exc).__name__}: {str(exc)[:120]}")


def _triton_version() -> str:
    return availability.triton.__version__ if availability.triton is not None else "none"


def parse_heads(text: str) -> tuple[int, int]:
    """(H, Hkv) of 'H' or 'H:Hkv' (Hkv key/value heads dividing H; 'H' means Hkv = H); a ValueError otherwise."""
    parts = text.strip().split(":")
    try:
        h, kv = (int(x) for x in (parts + parts)[:2]) if len(parts) <= 2 else (0, 0)
    except ValueError:
        h = kv = 0
    if h < 1 or kv < 1 or h % kv:
        raise ValueError(f"{text!r}: H or H:Hkv, positive integers with Hkv dividing H (e.g. 12, 14:2)")
    return h, kv


def parse_shapes(text: str) -> list[tuple]:
    """(B, H, Hkv, Tq, Tk, d) of each ';'-separated B,H,T,d or B,H,Tq,Tk,d, H optionally H:Hkv."""
    out = []
    usage = ("--shapes takes B,H,T,d or B,H,Tq,Tk,d separated by ';', H optionally H:Hkv (Hkv key/value heads "
             "dividing H), e.g. 4,12,4096,64;8,14:2,2048,64")
    for part in text.split(";"):
        fields = [x.strip() for x in part.split(",") if x.strip()]
        try:
            H, kv = parse_heads(fields[1]) if len(fields) > 1 else (0, 0)
            nums = [int(x) for i, x in enumerate(fields) if i != 1]
        except ValueError:
            raise SystemExit(f"{usage} (got {part!r})") from None
        if len(nums) not in (3, 4) or min(nums) < 1 or not H:
            raise SystemExit(f"{usage} (got {part!r})")
        B, *rest = nums
        tq, tk, d = (rest[0], rest[0], rest[1]) if len(rest) == 2 else rest
        out.append((B, H, kv, tq, tk, d))
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shapes", default="16,12,1024,64;4,12,4096,64;8,16,2048,128",
                   help="B,H,T,d or B,H,Tq,Tk,d, separated by ';'; H may be H:Hkv (grouped-query attention)")
    p.add_argument("--causal", default="1", choices=("0", "1", "both"))
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    p.add_argument("--layout", default="bthd", choices=("bthd", "bhtd"),
                   help="bthd: the model's (B, T, H, d) views transposed (default); bhtd: contiguous")
    p.add_argument("--mode", default="both", choices=("fwd", "bwd", "both"))
    p.add_argument("--fwd-phases", default=FWD_PHASES, help="knob=v1,v2 ... with phases separated by '|'")
    p.add_argument("--bwd-phases", default=BWD_PHASES)
    p.add_argument("--rep-ms", type=int, default=100)
    p.add_argument("--max-seconds", type=float, default=0, help="stop starting candidates after this long")
    p.add_argument("--no-baselines", action="store_true")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default="flash-sweep.json",
                   help="the JSON file to write, or a folder to write flash_sweep.json into")
    p.add_argument("--verbose", action="store_true", help="print the traceback of failing candidates")


def run(a: argparse.Namespace, error: Callable[[str], None]) -> list[dict]:
    sweep = Sweep(a)
    causals = {"0": [False], "1": [True], "both": [False, True]}[a.causal]
    for shape in parse_shapes(a.shapes):
        for causal in causals:
            sweep.run_shape(shape, causal)
    print(f"\nwrote {sweep.out} ({len(sweep.records)} records, {time.time() - sweep.t0:.0f} s)")
    return sweep.records
