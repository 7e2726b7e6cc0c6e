"""Experiment (not for landing): Triton causal forward with fills instead of per-element masks."""
import json, os, sys
import torch, triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def _lim(rows, n_rows, n_cols, tq, diag):
    return tl.where(rows < n_rows, tl.minimum(tl.maximum((rows % tq) + diag + 1, 0), n_cols), 0)


@triton.jit
def _finish(x, xt, c, lim, ROWS: tl.constexpr):
    """max/min (by the sign of c) over the bulk x and the tail xt, exps, sum -> (e, et, inv)"""
    if c > 0:
        r = tl.maximum(tl.max(x, axis=1), tl.max(xt, axis=1))
    else:
        r = tl.minimum(tl.min(x, axis=1), tl.min(xt, axis=1))
    r = tl.where(lim == 0, 0.0, r)[:, None]
    e = tl.exp2((x - r) * c)
    et = tl.exp2((xt - r) * c)
    s = tl.sum(e, axis=1) + tl.sum(et, axis=1)
    inv = (1.0 / tl.where(s == 0.0, 1.0, s))[:, None]
    return e, et, inv


@triton.jit
def k_tail(X, Y, n_rows, n_cols, stride_xr, stride_xc, tq, diag, c, fill,
           BLOCK_N: tl.constexpr, ROWS: tl.constexpr, VEC: tl.constexpr, TAIL: tl.constexpr, TVEC: tl.constexpr):
    """bulk: whole vectors of the prefix (loads stop at lo = lim rounded down to VEC; fill after);
    tail: TAIL columns from lo, exact mask (TVEC: the tail loaded as a whole vector, then masked)."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < n_rows
    lim = _lim(rows, n_rows, n_cols, tq, diag)
    lo = (lim // VEC) * VEC
    rows64 = rows.to(tl.int64)
    xr = X + rows64[:, None] * stride_xr
    yr = Y + rows64[:, None] * n_cols
    cols = tl.arange(0, BLOCK_N)[None, :]
    x = tl.load(xr + cols * stride_xc, mask=cols < lo[:, None], other=fill).to(tl.float32)
    tcols = lo[:, None] + tl.arange(0, TAIL)[None, :]
    if TVEC:
        xt = tl.load(xr + tcols * stride_xc, mask=row_ok[:, None] & (tcols < n_cols), other=fill).to(tl.float32)
        xt = tl.where(tcols < lim[:, None], xt, fill)
    else:
        xt = tl.load(xr + tcols * stride_xc, mask=tcols < lim[:, None], other=fill).to(tl.float32)
    e, et, inv = _finish(x, xt, c, lim, ROWS)
    tl.store(yr + cols, (e * inv).to(Y.dtype.element_ty),
             mask=row_ok[:, None] & ((cols < lo[:, None]) | (cols >= lo[:, None] + VEC)) & (cols < n_cols))
    tl.store(yr + tcols, (et * inv).to(Y.dtype.element_ty), mask=row_ok[:, None] & (tcols < lo[:, None] + VEC) & (tcols < n_cols))


@triton.jit
def k_where(X, Y, n_rows, n_cols, stride_xr, stride_xc, tq, diag, c, fill,
            BLOCK_N: tl.constexpr, ROWS: tl.constexpr, VEC: tl.constexpr):
    """bulk only: loads of whole vectors up to lim rounded up, then the exact mask per element"""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < n_rows
    lim = _lim(rows, n_rows, n_cols, tq, diag)
    hi = tl.minimum(((lim + VEC - 1) // VEC) * VEC, n_cols)
    rows64 = rows.to(tl.int64)
    cols = tl.arange(0, BLOCK_N)[None, :]
    x = tl.load(X + rows64[:, None] * stride_xr + cols * stride_xc, mask=cols < hi[:, None], other=fill).to(tl.float32)
    x = tl.where(cols < lim[:, None], x, fill)
    if c > 0:
        r = tl.max(x, axis=1)
    else:
        r = tl.min(x, axis=1)
    r = tl.where(lim == 0, 0.0, r)[:, None]
    e = tl.exp2((x - r) * c)
    s = tl.sum(e, axis=1)
    inv = (1.0 / tl.where(s == 0.0, 1.0, s))[:, None]
    tl.store(Y + rows64[:, None] * n_cols + cols, (e * inv).to(Y.dtype.element_ty), mask=row_ok[:, None] & (cols < n_cols))


VARIANTS = {
    # name: (kernel, constexprs, num_warps, extra launch options)
    "tail_vec_w1": (k_tail, dict(ROWS=1, TAIL=8, TVEC=True), 1, {}),
    "tail_vec_w1_r56": (k_tail, dict(ROWS=1, TAIL=8, TVEC=True), 1, {"maxnreg": 56}),
    "tail_vec_w2": (k_tail, dict(ROWS=1, TAIL=8, TVEC=True), 2, {}),
    "tail_scalar_w1": (k_tail, dict(ROWS=1, TAIL=8, TVEC=False), 1, {}),
    "tail32_w1": (k_tail, dict(ROWS=1, TAIL=32, TVEC=False), 1, {}),
    "where_w1": (k_where, dict(ROWS=1), 1, {}),
    "where_w2": (k_where, dict(ROWS=1), 2, {}),
    "where_r2w2": (k_where, dict(ROWS=2), 2, {}),
}


def launch(name, x, scale, y=None):
    kern, const, warps, extra = VARIANTS[name]
    tq, tk = x.shape[-2], x.shape[-1]
    x2 = x.reshape(-1, tk)
    y = torch.empty((x2.shape[0], tk), dtype=x.dtype, device=x.device) if y is None else y
    c = scale * LOG2E
    vec = 16 // x.element_size()
    block = triton.next_power_of_2(max(tk, vec))
    kern[(triton.cdiv(x2.shape[0], const["ROWS"]),)](
        x2, y, x2.shape[0], tk, x2.stride(0), x2.stride(1), tq, tk - tq, c, float("-inf") if c > 0 else float("inf"),
        BLOCK_N=block, VEC=vec, num_warps=warps, **const, **({} if os.environ.get("TRITON_INTERPRET") else extra))
    return y.view(x.shape)


def check(device):
    sys.path.insert(0, os.getcwd())
    from kernels.reference import reference_softmax
    g = torch.Generator().manual_seed(0)
    cases = []
    for shape in [(2, 3, 40, 64), (1, 2, 64, 64), (1, 2, 80, 64), (2, 1, 33, 60), (1, 1, 7, 5), (1, 1, 3, 1)]:
        for dt in (torch.bfloat16, torch.float16, torch.float32):
            for scale in (0.125, -0.7):
                x = (torch.randn(shape, generator=g) * 3).to(dt)
                if shape[-1] > 4:
                    x[..., 0, 2] = float("-inf")
                    x[..., -1, 3] = 1e4 if dt != torch.float16 else 6e4
                cases.append((x, scale))
    bad = 0
    for name in VARIANTS:
        worst = 0.0
        for x, scale in cases:
            xd = x.to(device)
            y = launch(name, xd, scale).float().cpu()
            ref = reference_softmax(x, scale=scale, causal=True).float()
            same_nan = torch.equal(y.isnan(), ref.isnan())
            d = (y - ref).abs()
            err = d[~ref.isnan()].max().item() if (~ref.isnan()).any() else 0.0
            if not (same_nan and err <= 1e-2):
                bad += 1
                print(f"  {name} {tuple(x.shape)} {x.dtype} {scale}: err {err}")
            worst = max(worst, err)
        print(f"{name}: worst abs err {worst:.2e}", flush=True)
    return bad


def bench():
    from harness.bench import bench_graph_ms, causal_traffic_ms
    from kernels.methods import triton_softmax as ts
    from kernels.methods import cuda_softmax as cs
    out = os.environ.get("OUT", "/tmp/res")
    shape = (8, 12, 1024, 1024)
    x = torch.randn(shape, device="cuda").mul_(2).to(torch.bfloat16)
    mask = ~torch.ones(1024, 1024, dtype=torch.bool, device="cuda").tril()
    ref = torch.softmax((x.float() * 0.125).masked_fill(mask, float("-inf")), -1)
    res = {"floor_ms": causal_traffic_ms(shape, torch.bfloat16, "cuda")}
    comp = torch.compile(lambda t: torch.softmax((t * 0.125).masked_fill(mask, float("-inf")), -1, dtype=torch.float32).to(t.dtype))
    res["compile_ms"] = bench_graph_ms(lambda: comp(x))[0]
    res["triton_ms"] = bench_graph_ms(lambda: ts.launch_fwd(x, 0.125, True))[0]
    cs.prepare()
    res["cuda_ms"] = bench_graph_ms(lambda: cs.cuda_softmax(x, 0.125, True))[0]
    print(res, flush=True)
    var = {}
    for rep in range(2):
        for name in VARIANTS:
            y = torch.empty((x.numel() // 1024, 1024), dtype=x.dtype, device="cuda")
            try:
                run = lambda: launch(name, x, 0.125, y)
                run(); torch.cuda.synchronize()
                err = (y.view(shape).float() - ref).abs().max().item()
                ms = bench_graph_ms(run)[0]
                v = var.setdefault(name, dict(ms=[], err=err))
                v["ms"].append(ms)
                print(f"  {name}: {ms:.4f} ms ({ms / res['compile_ms']:.3f} x compile) err {err:.1e}", flush=True)
            except Exception as e:
                var[name] = dict(error=repr(e)[:300])
                print(f"  {name}: ERROR {repr(e)[:300]}", flush=True)
        res[f"triton_ms_{rep}"] = bench_graph_ms(lambda: ts.launch_fwd(x, 0.125, True))[0]
        res[f"cuda_ms_{rep}"] = bench_graph_ms(lambda: cs.cuda_softmax(x, 0.125, True))[0]
    res["variants"] = var
    other = {}
    for t in (256, 512, 2048, 4096):
        xo = torch.randn((2**27 // (t * t), 1, t, t), device="cuda").to(torch.bfloat16)
        refo = torch.softmax((xo.float() * 0.125).masked_fill(~torch.ones(t, t, dtype=torch.bool, device="cuda").tril(), float("-inf")), -1)
        row = {"triton": bench_graph_ms(lambda: ts.launch_fwd(xo, 0.125, True))[0],
               "cuda": bench_graph_ms(lambda: cs.cuda_softmax(xo, 0.125, True))[0]}
        for w in (1, 2, 4, 8):
            if t // (32 * w) < 4:
                continue
            VARIANTS[f"tv_w{w}"] = (k_tail, dict(ROWS=1, TAIL=8, TVEC=True), w, {})
            yo = torch.empty((xo.numel() // t, t), dtype=xo.dtype, device="cuda")
            run = lambda: launch(f"tv_w{w}", xo, 0.125, yo)
            run(); torch.cuda.synchronize()
            err = (yo.view(xo.shape).float() - refo).abs().max().item()
            row[f"tv_w{w}"] = bench_graph_ms(run)[0] if err < 2e-2 else f"err {err}"
        other[t] = row
        print(f"  T={t}: " + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()), flush=True)
    res["other_T"] = other
    os.makedirs(out, exist_ok=True)
    json.dump(res, open(os.path.join(out, "cfill.json"), "w"), indent=1)
    print(f"==== causal: compile {res['compile_ms']:.4f} ms, triton {res['triton_ms']:.4f} ({res['triton_ms']/res['compile_ms']:.3f}), "
          f"cuda {res['cuda_ms']:.4f} ({res['cuda_ms']/res['compile_ms']:.3f}), floor {res['floor_ms']:.4f}")
    for k, v in sorted(var.items(), key=lambda kv: min(kv[1].get("ms", [9]))):
        if "ms" in v:
            print(f"  {k}: {min(v['ms']):.4f} ms {min(v['ms']) / res['compile_ms']:.3f} x compile, err {v['err']:.1e}")


def profile():
    from kernels.methods import triton_softmax as ts
    from kernels.methods import cuda_softmax as cs
    cs.prepare()
    x = torch.randn((8, 12, 1024, 1024), device="cuda").mul_(2).to(torch.bfloat16)
    for _ in range(2):
        ts.launch_fwd(x, 0.125, True)
        cs.cuda_softmax(x, 0.125, True)
        for name in ("tail_vec_w1", "where_w1"):
            launch(name, x, 0.125)
    torch.cuda.synchronize()


if __name__ == "__main__":
    if sys.argv[1:] == ["profile"]:
        sys.exit(profile())
    if sys.argv[1:] == ["check"]:
        sys.exit(1 if check("cuda" if torch.cuda.is_available() else "cpu") else 0)
    bench()
