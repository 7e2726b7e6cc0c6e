"""``python -m harness.bench overhead``: the harness's training throughput with the ``torch`` method (or
the ``accel=`` override's) against a bare PyTorch loop training the same model the same way (same model
code and method, AdamW fused, bf16 autocast, gradient clipping, same batches; with ``compile_model=true``
the same ``torch.compile`` of the whole model, ``compile_mode`` included), alternating the two, in the
same process. The bare loop clips as a plain loop does (``clip_grad_norm_``); the harness by the same rule
inside the fused AdamW's pass (``harness.task.clip_gradients``), which is part of what it measures
against."""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from pathlib import Path
from typing import Callable

import torch
from hydra import compose, initialize_config_dir

from harness.build import accel_applied, build_model, seq_len
from harness.config import CONF_DIR
from harness.data import BatchStream, make_corpus
from harness.env import environment
from harness.results import write_json
from harness.task import make_optimizer, warmup_cosine_lr, whole_model_compiled
from harness.training import run_training


def bare_loop_tokens_per_s(cfg, steps: int, warmup: int) -> float:
    """Train the same model the same way as the harness does, with nothing around it."""
    torch.manual_seed(cfg.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    seq = seq_len(cfg)
    model = build_model(cfg).to(device)
    vocab = model.config.vocab_size
    accel_applied(model, cfg)
    # compiled as LanguageModelTask compiles it (the compile time falls in the warm-up steps)
    fwd, cudagraphs = whole_model_compiled(model, cfg.compile_model, cfg.compile_mode)
    opt = make_optimizer(model, cfg.trainer.lr, cfg.trainer.weight_decay, (cfg.trainer.beta1, cfg.trainer.beta2))
    corpus = make_corpus(cfg.data, seq)
    total = steps + warmup
    stream = BatchStream(None if corpus is None else corpus.train, vocab, cfg.data.batch_size, seq,
                         cfg.seed, "train", 0, total)
    amp = torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda")
    t0 = None
    for i, (x, y) in enumerate(stream):
        for group in opt.param_groups:  # as LanguageModelTask.on_train_batch_start does
            group["lr"] = warmup_cosine_lr(i, cfg.trainer.lr, cfg.trainer.lr_warmup_steps, total,
                                           cfg.trainer.min_lr_ratio)
        if i == warmup:
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        if device == "cuda":
            x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        if cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        with amp:
            _, loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.trainer.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    if device == "cuda":
        torch.cuda.synchronize()
    return steps * cfg.data.batch_size * seq / (time.perf_counter() - t0)


def run_overhead(overrides: list[str], steps: int, rounds: int, out: Path) -> dict:
    warmup = 5
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "model=gpt2s", "accel=torch", "data=synthetic", "logger=none", f"trainer.max_steps={steps + warmup}",
            f"trainer.warmup_steps={warmup}", "trainer.window=10", "trainer.val_every=0", "trainer.val_batches=1",
            *overrides,
        ])
    harness_tps, bare_tps = [], []
    for r in range(rounds):
        res = run_training(cfg, out / f"harness_round{r}")
        harness_tps.append(res["tokens_per_s"])
        gc.collect()
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
        bare_tps.append(bare_loop_tokens_per_s(cfg, steps, warmup))
        gc.collect()
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
        print(f"round {r}: harness {harness_tps[-1]:,.0f} tokens/s, bare loop {bare_tps[-1]:,.0f} tokens/s", flush=True)
    h, b = statistics.median(harness_tps), statistics.median(bare_tps)
    result = {"env": environment(), "model": cfg.model.name, "accel": cfg.accel.name,
              "compile_model": bool(cfg.compile_model), "compile_mode": cfg.compile_mode, "steps": steps,
              "rounds": rounds, "harness_tokens_per_s": harness_tps, "bare_tokens_per_s": bare_tps,
              "harness_median": h, "bare_median": b, "ratio": h / b}
    write_json(out / "overhead.json", result)
    print(f"harness / bare loop = {h / b:.3f} (harness {h:,.0f}, bare {b:,.0f} tokens/s; median of {rounds})")
    return result


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("overrides", nargs="*", default=[], help="Hydra overrides over model=gpt2s accel=torch")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default="outputs/bench", type=Path)


def run(a: argparse.Namespace, error: Callable[[str], None]) -> dict:
    return run_overhead(a.overrides, a.steps, a.rounds, a.out)
