"""``python -m harness.bench launch``: the host cost per call.

For every method and every op it implements natively, at a tiny shape where the GPU work takes a few
microseconds and the host decides: microseconds of host time per call for the one-shot entry point
(``kernels.softmax(x, method=m)``), the bound function (``kernels.bind(m)``, what a model calls), and
the bound function forward + backward (``torch.autograd.grad``). Host time is the wall time of many
calls in a row with the device synchronized only before and after (the tiny kernels keep up, so the
queue never fills and the wall time is the host's). A median over repeats, with the spread.

The ``triton`` method is measured twice, once per launch path of its softmax (column ``launch``):
``direct`` (compiled kernels' launchers called directly: ``kernels.runtime.fastlaunch``) and
``plain`` (every launch through ``kernel[grid]``, as with ``HARNESS_TRITON_DIRECT=0``); where the direct
path cannot run here the first row says why.

Two rows put the host itself on the table, measured in the same run (the lent hosts differ: a bound
``torch`` softmax forward took 9.7 us on one and 63 us on another, docs/perf.md): ``host: torch.softmax``,
PyTorch's own softmax called bare (forward; forward + backward through its C++ autograd node), and
``host: identity Function``, an ``autograd.Function`` that returns its input, whose forward + backward
is what the autograd engine alone costs a method built as a Python Function (the triton, cuda and
flash eager routes are). No method's forward + backward can cost less than that row here.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

import kernels
from harness.bench.common import error_text, host_us, parse_names
from harness.env import environment
from harness.results import write_json
from kernels.runtime import fastlaunch

#: op -> tiny inputs (built on the device), the one-shot call, the bound call's arguments
TINY = {
    "softmax": dict(shape=(2, 4, 64, 64)),
    "attention": dict(shape=(1, 2, 64, 64)),
    "cross_entropy": dict(shape=(64, 512)),
}


@dataclass
class LaunchRow:
    method: str
    op: str
    shape: tuple
    one_shot_us: Optional[float] = None
    bound_us: Optional[float] = None
    bound_fwd_bwd_us: Optional[float] = None
    one_shot_over_bound: Optional[float] = None
    spread: Optional[float] = None  # p90 / p50 of the bound forward's repeats
    launch: str = ""  # triton: the launch path (direct, plain)
    error: str = ""


def _softmax_inputs(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """x (requires grad) and dy at the softmax's tiny shape."""
    g = torch.Generator().manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    shape = TINY["softmax"]["shape"]
    return (torch.randn(shape, generator=g).to(device, dtype).requires_grad_(True),
            torch.randn(shape, generator=g).to(device, dtype))


def _calls(method: str, op: str, device: str):
    """(one-shot, bound forward, bound forward + backward) for ``op`` of ``method`` on tiny inputs."""
    g = torch.Generator().manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    shape = TINY[op]["shape"]
    if op == "softmax":
        x, dy = _softmax_inputs(device)
        fn = kernels.bind(method, "softmax")
        return (lambda: kernels.softmax(x.detach(), scale=0.125, causal=True, method=method),
                lambda: fn(x.detach(), 0.125, True),
                lambda: torch.autograd.grad(fn(x, 0.125, True), x, dy))
    if op == "attention":
        q, k, v = (torch.randn(shape, generator=g).to(device, dtype).requires_grad_(True) for _ in range(3))
        do = torch.randn(shape, generator=g).to(device, dtype)
        fn = kernels.bind(method, "attention")
        return (lambda: kernels.attention(q.detach(), k.detach(), v.detach(), method=method),
                lambda: fn(q.detach(), k.detach(), v.detach(), None, True, 0.0),
                lambda: torch.autograd.grad(fn(q, k, v, None, True, 0.0), (q, k, v), do))
    if op == "cross_entropy":
        logits = torch.randn(shape, generator=g).to(device, dtype).requires_grad_(True)
        t = torch.randint(0, shape[1], shape[:1], generator=g).to(device)
        fn = kernels.bind(method, "cross_entropy")
        return (lambda: kernels.cross_entropy(logits.detach(), t, method=method),
                lambda: fn(logits.detach(), t, -100, "mean"),
                lambda: torch.autograd.grad(fn(logits * 1, t, -100, "mean"), logits))
    raise ValueError(op)


class _Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g


def _host_rows(device: str, calls: int) -> list[LaunchRow]:
    """The host's own floor (module docstring): bare torch.softmax and an identity autograd.Function."""
    x, dy = _softmax_inputs(device)
    xd = x.detach()
    calls_of = {
        "host: torch.softmax": (lambda: torch.softmax(xd, -1), lambda: torch.autograd.grad(torch.softmax(x, -1), x, dy)),
        "host: identity Function": (lambda: _Identity.apply(xd), lambda: torch.autograd.grad(_Identity.apply(x), x, dy)),
    }
    rows = []
    for name, (fwd, both) in calls_of.items():
        row = LaunchRow(name, "softmax", TINY["softmax"]["shape"])
        try:
            row.bound_us, row.spread = host_us(fwd, calls)
            row.bound_fwd_bwd_us, _ = host_us(both, max(20, calls // 2))
        except Exception as exc:
            row.error = error_text(exc)
        rows.append(row)
    return rows


def default_methods() -> list[str]:
    """Every method that can run here (timing-only ones too: their host cost is real)."""
    return kernels.runnable_methods(include_timing_only=True)


def _launch_paths(method: str) -> list[tuple[str, Optional[bool]]]:
    """(label, fastlaunch setting) per measurement of the method: the triton method once per launch path."""
    if method != "triton":
        return [("", None)]
    why = fastlaunch.unsupported_reason()
    return [("direct" if why is None else f"direct unavailable ({why[:80]}): plain", True), ("plain", False)]


def _measure(row: LaunchRow, method: str, op: str, device: str, calls: int) -> None:
    try:
        one, bound, both = _calls(method, op, device)
        row.one_shot_us, _ = host_us(one, calls)
        row.bound_us, row.spread = host_us(bound, calls)
        row.bound_fwd_bwd_us, _ = host_us(both, max(20, calls // 2))
        row.one_shot_over_bound = row.one_shot_us / row.bound_us
    except Exception as exc:  # one failing method must not stop the table
        row.error = error_text(exc)


def _print_row(row: LaunchRow) -> None:
    nan = float("nan")
    print(f"  {row.method:10s} {row.op:14s} {row.launch[:6]:6s} one-shot {row.one_shot_us or nan:7.1f} us  "
          f"bound {row.bound_us or nan:7.1f} us  fwd+bwd {row.bound_fwd_bwd_us or nan:7.1f} us  {row.error}", flush=True)


def _table(rows: list[LaunchRow]) -> str:
    lines = ["| method | launch | op | shape | one-shot us | bound us | one-shot / bound | bound fwd+bwd us | p90/p50 |",
             "|---|---|---|---|---|---|---|---|---|"]
    f = lambda v, s=".1f": "-" if v is None else format(v, s)  # noqa: E731
    for r in rows:
        lines.append(f"| {r.method} | {r.launch} | {r.op} | {'x'.join(map(str, r.shape))} | {f(r.one_shot_us)} | {f(r.bound_us)} | "
                     f"{f(r.one_shot_over_bound, '.2f')} | {f(r.bound_fwd_bwd_us)} | {f(r.spread, '.2f')} |"
                     + (f" error: {r.error}" if r.error else ""))
    return "\n".join(lines) + "\n"


def run_launch_bench(methods: Optional[list[str]], out: Path, calls: int = 200) -> list[LaunchRow]:
    """Measure every row; launch.json and launch.md are rewritten after each one, so a run cut short
    (a time limit on a lent machine) keeps every row it measured, the host's floor first."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out.mkdir(parents=True, exist_ok=True)
    env = environment()
    rows: list[LaunchRow] = []

    def add(row: LaunchRow) -> None:
        rows.append(row)
        _print_row(row)
        write_json(out / "launch.json", {"env": env, "device": device, "rows": [asdict(r) for r in rows]})
        (out / "launch.md").write_text(_table(rows))

    for row in _host_rows(device, calls):
        add(row)
    for method in methods or default_methods():
        m = kernels.get_method(method)
        if m.prepare is not None:
            m.prepare()  # a build is not a launch cost
        for label, direct in _launch_paths(method):
            if direct is not None:
                fastlaunch.configure(direct)
            try:
                for op in TINY:
                    if getattr(m, op) is None:  # native ops only: a composed op's cost is its parts'
                        continue
                    row = LaunchRow(method, op, TINY[op]["shape"], launch=label)
                    _measure(row, method, op, device, calls)
                    add(row)
            finally:
                if direct is not None:
                    fastlaunch.configure()
    print(_table(rows), end="")
    return rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--methods", default="", help="comma-separated methods (default: every method here)")
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--out", default="outputs/bench", type=Path)


def run(a: argparse.Namespace, error: Callable[[str], None]) -> list[LaunchRow]:
    return run_launch_bench(parse_names(a.methods), a.out, a.calls)
