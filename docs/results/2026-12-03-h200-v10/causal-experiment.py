"""Experiment (not for landing): Triton causal forward variants at the attention shape."""
import json, os, sys, time
import torch, triton
import triton.language as tl
from harness.bench import bench_graph_ms, causal_traffic_ms
from kernels.methods import triton_softmax as ts
from kernels.methods.triton_softmax import _signed, _one_row_limit

OUT = os.environ.get("OUT", "/tmp/res")
LOG2E = 1.4426950408889634
SMS = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132


@triton.jit
def persist_causal(X, Y, n_rows, n_cols, stride_xr, tq, diag, scale_log2e,
                   BLOCK_N: tl.constexpr, STAGES: tl.constexpr, ROUND: tl.constexpr):
    cols = tl.arange(0, BLOCK_N)
    a = tl.abs(scale_log2e)
    for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0), num_stages=STAGES):
        r = tl.cast(row, tl.int64)
        lim = _one_row_limit(r, n_cols, tq, diag, True)
        keep = cols < lim
        if ROUND:
            ld = cols < tl.minimum(((lim + 7) // 8) * 8, n_cols)
        else:
            ld = keep
        x = tl.load(X + r * stride_xr + cols, mask=ld, other=0.0).to(tl.float32)
        x = _signed(x, scale_log2e)
        m = tl.max(tl.where(keep, x, float("-inf")), axis=0)
        m = tl.where(m == float("-inf"), 0.0, m)
        e = tl.where(keep, tl.exp2((x - m) * a), 0.0)
        s = tl.sum(e, axis=0)
        inv = 1.0 / tl.where(s == 0.0, 1.0, s)
        tl.store(Y + r * n_cols + cols, (e * inv).to(Y.dtype.element_ty), mask=cols < n_cols)


@triton.jit
def _part(x_row, c0, lim, SUB: tl.constexpr):
    cols = c0 + tl.arange(0, SUB)
    return tl.load(x_row + cols, mask=cols < lim, other=float("-inf")).to(tl.float32)


@triton.jit
def chunked_causal(X, Y, n_rows, n_cols, stride_xr, tq, diag, scale_log2e, SUB: tl.constexpr):
    """4 sub-chunks of SUB columns (N = 4 * SUB); exps only for sub-chunks holding unmasked keys."""
    row = tl.program_id(0).to(tl.int64)
    lim = _one_row_limit(row, n_cols, tq, diag, True)
    x_row = X + row * stride_xr
    y_row = Y + row * n_cols
    a = tl.abs(scale_log2e)
    cols = tl.arange(0, SUB)
    x0 = _signed(_part(x_row, 0, lim, SUB), scale_log2e)
    x1 = _signed(_part(x_row, SUB, lim, SUB), scale_log2e)
    x2 = _signed(_part(x_row, 2 * SUB, lim, SUB), scale_log2e)
    x3 = _signed(_part(x_row, 3 * SUB, lim, SUB), scale_log2e)
    # masked keys are -inf (scale > 0) / +inf (scale < 0) after the sign: set them to -inf explicitly
    x0 = tl.where(cols < lim, x0, float("-inf"))
    x1 = tl.where(SUB + cols < lim, x1, float("-inf"))
    x2 = tl.where(2 * SUB + cols < lim, x2, float("-inf"))
    x3 = tl.where(3 * SUB + cols < lim, x3, float("-inf"))
    m = tl.maximum(tl.maximum(tl.max(x0, 0), tl.max(x1, 0)), tl.maximum(tl.max(x2, 0), tl.max(x3, 0)))
    m = tl.where(m == float("-inf"), 0.0, m)
    s = tl.sum(tl.exp2((x0 - m) * a), 0)
    if lim > SUB:
        s += tl.sum(tl.exp2((x1 - m) * a), 0)
    if lim > 2 * SUB:
        s += tl.sum(tl.exp2((x2 - m) * a), 0)
    if lim > 3 * SUB:
        s += tl.sum(tl.exp2((x3 - m) * a), 0)
    inv = 1.0 / tl.where(s == 0.0, 1.0, s)
    tl.store(y_row + cols, (tl.exp2((x0 - m) * a) * inv).to(Y.dtype.element_ty))
    z = tl.zeros([SUB], Y.dtype.element_ty)
    if lim > SUB:
        tl.store(y_row + SUB + cols, (tl.exp2((x1 - m) * a) * inv).to(Y.dtype.element_ty))
    else:
        tl.store(y_row + SUB + cols, z)
    if lim > 2 * SUB:
        tl.store(y_row + 2 * SUB + cols, (tl.exp2((x2 - m) * a) * inv).to(Y.dtype.element_ty))
    else:
        tl.store(y_row + 2 * SUB + cols, z)
    if lim > 3 * SUB:
        tl.store(y_row + 3 * SUB + cols, (tl.exp2((x3 - m) * a) * inv).to(Y.dtype.element_ty))
    else:
        tl.store(y_row + 3 * SUB + cols, z)


def main():
    shape = (8, 12, 1024, 1024)
    x = torch.randn(shape, device="cuda").mul_(2).to(torch.bfloat16)
    ref = torch.softmax((x.float() * 0.125).masked_fill(~torch.ones(1024, 1024, dtype=torch.bool, device="cuda").tril(), float("-inf")), -1)
    x2 = x.view(-1, 1024)
    n_rows = x2.shape[0]
    res = {"floor_ms": causal_traffic_ms(shape, torch.bfloat16, "cuda")}
    comp = torch.compile(lambda t: torch.softmax((t * 0.125).masked_fill(~torch.ones(1024, 1024, dtype=torch.bool, device="cuda").tril(), float("-inf")), -1, dtype=torch.float32).to(t.dtype))
    res["compile_ms"] = bench_graph_ms(lambda: comp(x))[0]
    res["triton_ms"] = bench_graph_ms(lambda: ts.launch_fwd(x, 0.125, True))[0]
    print(res, flush=True)
    variants = {}
    for warps in (1, 2):
        for stages in (1, 3):
            for per in (16, 32):
                for rnd in (False, True):
                    variants[f"persist_w{warps}_s{stages}_p{per}_r{int(rnd)}"] = (lambda w=warps, s=stages, p=per, r=rnd, y=None: persist_causal[(min(n_rows, SMS * p),)](
                        x2, y, n_rows, 1024, 1024, 1024, 0, 0.125 * LOG2E, BLOCK_N=1024, STAGES=s, ROUND=r, num_warps=w))
    for warps in (1, 2):
        variants[f"chunked_w{warps}"] = (lambda w=warps, y=None: chunked_causal[(n_rows,)](x2, y, n_rows, 1024, 1024, 1024, 0, 0.125 * LOG2E, SUB=256, num_warps=w))
    out = {}
    for name, fn in variants.items():
        y = torch.empty_like(x2)
        try:
            run = lambda: fn(y=y)
            run(); torch.cuda.synchronize()
            err = (y.view(shape).float() - ref).abs().max().item()
            ms = bench_graph_ms(run)[0]
            out[name] = dict(ms=ms, err=err, vs_compile=ms / res["compile_ms"])
            print(f"  {name}: {ms:.4f} ms ({ms / res['compile_ms']:.3f} x compile) err {err:.1e}", flush=True)
        except Exception as e:
            out[name] = dict(error=repr(e)[:300])
            print(f"  {name}: ERROR {repr(e)[:200]}", flush=True)
    res["variants"] = out
    os.makedirs(OUT, exist_ok=True)
    json.dump(res, open(os.path.join(OUT, "causal_exp.json"), "w"), indent=1)
    ok = {k: v for k, v in out.items() if "ms" in v and v["err"] < 2e-2}
    best = sorted(ok.items(), key=lambda kv: kv[1]["ms"])[:5]
    print(f"==== causal: compile {res['compile_ms']:.4f} ms, triton {res['triton_ms']:.4f} ({res['triton_ms']/res['compile_ms']:.3f}), floor {res['floor_ms']:.4f}")
    for k, v in best:
        print(f"  {k}: {v['ms']:.4f} ms {v['vs_compile']:.3f} x compile")


if __name__ == "__main__":
    main()
