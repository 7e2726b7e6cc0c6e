"""Where the time goes: one training step split into the attention, the loss, the matmuls and the rest.

Marks are identity autograd functions that record a CUDA event (a wall-clock time on a CPU, where the
numbers mean little but the plumbing is the same) when the forward passes them and another when the
gradient does. A pair of marks brackets an op: the first mark before its inputs, the second on its
output. In the forward the two marks bracket the op's kernels. In the backward the output mark's
backward runs first and the input mark's last, so they bracket exactly the op's backward nodes:
autograd runs the nodes in reverse order of creation, and nothing else was created between the two
marks. A mark takes all of an op's tensor inputs at once (one autograd node, so its backward runs
once, after every input's gradient is done). The device is synchronized once per measured step, after
it. Eager models only: the marks would break a compiled graph.

What is bracketed, and how each part of the step is measured:

* **attention**: the model's attention core (marked through ``harness.accel.mark_ops``), around the
  whole op (the method's ``attention_qkv`` where the run has it: the op on the unsplit projection). For a
  method whose attention is composed from its softmax (kernels.compose: q k^T, softmax, @ v) the
  softmax is bracketed too, inside, and the attention part is that softmax alone; the two attention
  matmuls around it (the core minus the softmax) count as matmuls. For a method with a native
  (fused) attention the part is the whole fused op, matmuls included. A model whose attention was
  not patched keeps its eager attention, reported whole.
* **loss**: the model's loss (its loss seam): the cross-entropy on the logits, or, in the linear
  form, the fused LM head + cross-entropy.
* **matmuls**: every ``nn.Linear`` (forward hooks put marks around each: the QKV, output and MLP
  projections and, in the logits form, the LM head), plus the composed attention's two matmuls.
* **rest**: the step minus the parts above: embeddings, layer norms, GELU, residual adds, the
  optimizer step, the launch gaps.

Amdahl: if a part took no time at all a step would take ``step - part``, so nothing that speeds up
that part alone can make the step more than ``step / (step - part)`` times faster. The model's bound for
its two softmaxes (``amdahl_softmaxes``) zeroes the attention part and the loss part together (in the
linear loss form the loss part holds the LM head's matmuls too, which it then counts).
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

import torch
import torch.nn as nn
from omegaconf import open_dict

from harness.accel import mark_ops
from harness.build import accel_applied, build_model, data_seed, seq_len
from harness.data import BatchStream, make_corpus


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
    """Identity on its tensors that records ``<part>:fwd_<edge>`` when the forward passes it and
    ``<part>:bwd_<other edge>`` when the gradients do (one node for all the tensors)."""

    @staticmethod
    def forward(ctx, marks, fwd_name, bwd_name, *xs):
        ctx.marks, ctx.bwd_name = marks, bwd_name
        marks.mark(fwd_name)
        out = tuple(x.view_as(x) for x in xs)
        return out if len(out) > 1 else out[0]

    @staticmethod
    def backward(ctx, *grads):
        ctx.marks.mark(ctx.bwd_name)
        return (None, None, None, *grads)


def _open(marks: _Marks, part: str, *xs):
    """Mark the inputs of an op of ``part``: the forward's start; its backward is the op's backward end."""
    return _Mark.apply(marks, f"{part}:fwd_start", f"{part}:bwd_end", *xs)


def _close(marks: _Marks, part: str, y):
    """Mark the output of an op of ``part``: the forward's end; its backward is the op's backward start."""
    return _Mark.apply(marks, f"{part}:fwd_end", f"{part}:bwd_start", y)


def marked_softmax(fn: Callable, marks: _Marks) -> Callable:
    def softmax_with_marks(scores, scale, causal, **options):
        return _close(marks, "softmax", fn(_open(marks, "softmax", scores), scale, causal, **options))

    return softmax_with_marks


def marked_attention(fn: Callable, marks: _Marks) -> Callable:
    def attention_with_marks(q, k, v, scale, causal, dropout_p):
        q, k, v = _open(marks, "attention", q, k, v)
        return _close(marks, "attention", fn(q, k, v, scale, causal, dropout_p))

    return attention_with_marks


def marked_attention_qkv(fn: Callable, marks: _Marks) -> Callable:
    def attention_qkv_with_marks(qkv, n_head, scale, causal, dropout_p, n_kv_head=None):  # (n_kv_head: grouped)
        return _close(marks, "attention", fn(_open(marks, "attention", qkv), n_head, scale, causal, dropout_p,
                                             n_kv_head))

    return attention_qkv_with_marks


def marked_loss(fn: Callable, marks: _Marks) -> Callable:
    def loss_with_marks(*args):
        idx = [i for i, a in enumerate(args) if torch.is_tensor(a) and a.is_floating_point()]
        opened = _open(marks, "loss", *[args[i] for i in idx])
        opened = opened if isinstance(opened, tuple) else (opened,)
        args = list(args)
        for i, t in zip(idx, opened):
            args[i] = t
        return _close(marks, "loss", fn(*args))

    return loss_with_marks


#: what harness.accel.mark_ops hands to be marked -> how it is marked
_MARKERS = {"softmax": marked_softmax, "attention": marked_attention, "attention_qkv": marked_attention_qkv,
            "loss": marked_loss}


def _mark_linears(model: nn.Module, marks: _Marks) -> list:
    handles = []
    for m in model.modules():
        if isinstance(m, nn.Linear):
            handles.append(m.register_forward_pre_hook(lambda mod, args: (_open(marks, "linear", args[0]),) + args[1:]))
            handles.append(m.register_forward_hook(lambda mod, args, out: _close(marks, "linear", out)))
    return handles


def _sums(marks: _Marks) -> dict[str, dict[str, float]]:
    """part -> {"fwd": ms, "bwd": ms}: the bracketed intervals of each part, summed."""
    out: dict[str, dict[str, float]] = {}
    opened: dict[tuple[str, str], object] = {}
    for name, p in marks.points:
        if ":" not in name:
            continue
        part, edge = name.split(":")
        phase, which = edge.split("_")
        if which == "start":
            opened[(part, phase)] = p
        elif (part, phase) in opened:
            d = out.setdefault(part, {"fwd": 0.0, "bwd": 0.0})
            d[phase] += marks.elapsed_ms(opened.pop((part, phase)), p)
    return out


@dataclass
class Part:
    name: str  # what the part is ("attention softmax", "fused attention", "loss (cross-entropy)", ...)
    ms: float
    fwd_ms: Optional[float] = None
    bwd_ms: Optional[float] = None
    share: float = 0.0
    amdahl: float = 1.0  # the most the whole step could speed up if this part took no time


@dataclass
class Breakdown:
    step_ms: float
    parts: dict = field(default_factory=dict)  # attention | loss | matmuls | rest -> Part
    # the attention part alone, under the names of the earlier softmax-only breakdown
    softmax_fwd_ms: float = 0.0
    softmax_bwd_ms: float = 0.0
    other_ms: float = 0.0
    softmax_share: float = 0.0
    amdahl_max_speedup: float = 1.0
    amdahl_softmaxes: float = 1.0  # the most the step could speed up if attention and loss both took no time

    def as_dict(self) -> dict:
        d = asdict(self)
        d["parts"] = {k: asdict(v) if isinstance(v, Part) else v for k, v in self.parts.items()}
        return d


def _part(name: str, fwd: float, bwd: Optional[float], step: float) -> Part:
    ms = fwd + (bwd or 0.0)
    rest = max(step - ms, 1e-9)
    return Part(name, ms, fwd, bwd, ms / step if step else 0.0, step / rest)


def measure(model: nn.Module, batches: list, applied=None, steps: int = 5, warmup: int = 2,
            loss_form: str = "logits") -> Breakdown:
    """Train ``model`` (already on its device, the method already applied: ``applied`` is its
    harness.accel.Applied) for warmup + steps on ``batches`` with marks around its parts; medians
    over the measured steps. An attention composed from the method's softmax is rebuilt around the
    marked softmax (harness.accel.mark_ops)."""
    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    marks = _Marks(cuda)
    how = getattr(applied, "attention", None)
    composed = how == "composed"
    undo = mark_ops(model, applied, lambda part, fn: _MARKERS[part](fn, marks))
    hooks = _mark_linears(model, marks)
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
            if i >= warmup:
                rows.append((marks.elapsed_ms(marks.points[0][1], marks.points[-1][1]), _sums(marks)))
    finally:
        for h in hooks:
            h.remove()
        undo()
    step = statistics.median(r[0] for r in rows)

    def med(part: str, phase: str) -> float:
        return statistics.median(r[1].get(part, {}).get(phase, 0.0) for r in rows)

    att_f, att_b = med("attention", "fwd"), med("attention", "bwd")
    sm_f, sm_b = med("softmax", "fwd"), med("softmax", "bwd")
    lin = med("linear", "fwd") + med("linear", "bwd")
    if composed:
        attention = _part("attention softmax", sm_f, sm_b, step)
        matmul_ms = lin + max(att_f + att_b - sm_f - sm_b, 0.0)
    else:
        attention = _part("fused attention" if how == "native" else "attention (eager, unpatched)", att_f, att_b, step)
        matmul_ms = lin
    loss_name = "loss (LM head + cross-entropy)" if loss_form == "linear" else "loss (cross-entropy)"
    loss = _part(loss_name, med("loss", "fwd"), med("loss", "bwd"), step)
    matmuls = _part("matmuls", matmul_ms, None, step)
    rest = _part("rest", max(step - attention.ms - loss.ms - matmuls.ms, 0.0), None, step)
    return Breakdown(step, {"attention": attention, "loss": loss, "matmuls": matmuls, "rest": rest},
                     softmax_fwd_ms=attention.fwd_ms or 0.0, softmax_bwd_ms=attention.bwd_ms or 0.0,
                     other_ms=max(step - attention.ms, 1e-9), softmax_share=attention.share,
                     amdahl_max_speedup=attention.amdahl,
                     amdahl_softmaxes=step / max(step - attention.ms - loss.ms, 1e-9))


def profile_step(cfg, accel):
    """Where one eager training step's time goes for the run ``cfg`` with the accel configuration
    ``accel`` (a study's configuration and variant, every key filled in)."""
    device = "cuda" if torch.cuda.is_available() and cfg.trainer.accelerator != "cpu" else "cpu"
    c = copy.deepcopy(cfg)
    with open_dict(c):
        c.accel = accel
    seq = seq_len(c)
    torch.manual_seed(c.seed)
    model = build_model(c)
    applied = accel_applied(model, c)
    model = model.to(device)
    corpus = make_corpus(c.data, seq)
    stream = BatchStream(None if corpus is None else corpus.train, model.config.vocab_size,
                         int(c.data.batch_size), seq, data_seed(c), "train", 0, 3)
    try:
        return measure(model, list(stream), applied, loss_form=model.loss_form)  # eager when not patched
    finally:
        applied.undo()
        del model
