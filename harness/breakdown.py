"""Where the time goes: one training step split into softmax forward, softmax backward and the rest.

Identity autograd functions placed before and after the softmax in every attention block (the
method's softmax inside the attention composed from it, see kernels.compose) record CUDA
events (wall-clock marks on a CPU): forward marks bracket the softmax's forward kernels; in backward the
outer mark's backward runs first and the inner one's last, so they bracket exactly the softmax's
backward nodes (autograd runs nodes in reverse creation order, and nothing else was created between
the two marks). The device is synchronized once per measured step, after it. Eager models only: the
marks would break a compiled graph.

Amdahl: if the softmax took no time at all, a step would take ``step - softmax``, so no softmax method
can speed the step up by more than ``step / (step - softmax_fwd - softmax_bwd)``.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch


class _Marks:
    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.points: list[tuple[str, object]] = []

    def mark(self, name: str) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.points.append((name, ev))
        else:
            self.points.append((name, time.perf_counter()))

    def elapsed_ms(self, a, b) -> float:
        return a.elapsed_time(b) if self.cuda else 1000.0 * (b - a)


class _Mark(torch.autograd.Function):
    """Identity that records ``fwd_name`` when the forward passes it and ``bwd_name`` when the gradient
    does."""

    @staticmethod
    def forward(ctx, x, marks, fwd_name, bwd_name):
        ctx.marks, ctx.bwd_name = marks, bwd_name
        marks.mark(fwd_name)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        ctx.marks.mark(ctx.bwd_name)
        return g, None, None, None


def marked(fn: Callable, marks: _Marks) -> Callable:
    def softmax_with_marks(scores, scale, causal):
        scores = _Mark.apply(scores, marks, "fwd_start", "bwd_end")  # its backward runs last
        return _Mark.apply(fn(scores, scale, causal), marks, "fwd_end", "bwd_start")  # ... and this one first

    return softmax_with_marks


@dataclass
class Breakdown:
    step_ms: float
    softmax_fwd_ms: float
    softmax_bwd_ms: float
    other_ms: float
    softmax_share: float
    amdahl_max_speedup: float

    def as_dict(self) -> dict:
        return asdict(self)


def measure(model: torch.nn.Module, batches: list, softmax: Callable, steps: int = 5, warmup: int = 2) -> Breakdown:
    """Train ``model`` (already on its device) for warmup + steps on ``batches`` with the marked softmax
    in every attention core (attention composed from it); medians over the measured steps."""
    from kernels.compose import attention_from_softmax
    from models import set_attention

    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    marks = _Marks(cuda)
    undo = set_attention(model, attention_from_softmax(marked(softmax, marks)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda)
    rows = []
    try:
        for i in range(warmup + steps):
            x, y = batches[i % len(batches)]
            x, y = x.to(device), y.to(device)
            marks.points.clear()
            marks.mark("step_start")
            with amp:
                _, loss = model(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            marks.mark("step_end")
            if cuda:
                torch.cuda.synchronize()
            if i < warmup:
                continue
            pts = marks.points
            step = marks.elapsed_ms(pts[0][1], pts[-1][1])
            fwd = bwd = 0.0
            open_fwd = open_bwd = None
            for name, p in pts:
                if name == "fwd_start":
                    open_fwd = p
                elif name == "fwd_end" and open_fwd is not None:
                    fwd += marks.elapsed_ms(open_fwd, p)
                    open_fwd = None
                elif name == "bwd_start":
                    open_bwd = p
                elif name == "bwd_end" and open_bwd is not None:
                    bwd += marks.elapsed_ms(open_bwd, p)
                    open_bwd = None
            rows.append((step, fwd, bwd))
    finally:
        undo()
    step = statistics.median(r[0] for r in rows)
    fwd = statistics.median(r[1] for r in rows)
    bwd = statistics.median(r[2] for r in rows)
    other = max(step - fwd - bwd, 1e-9)
    return Breakdown(step, fwd, bwd, other, (fwd + bwd) / step, step / other)
