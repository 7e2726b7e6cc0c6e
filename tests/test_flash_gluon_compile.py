"""flash's Gluon kernels (kernels/methods/flash/fwd_gluon.py, bwd_gluon.py) compiled for sm_90 without a GPU
(tests.compiled_report: a subprocess without TRITON_INTERPRET, the Triton of HARNESS_COMPILE_PYTHON where
set): warp-specialized, TMA loads, wgmma, the barrier protocol read off the PTX, no spill, shared memory
within the H200's; and ``flash-compile-check`` reporting them."""

from __future__ import annotations

import re

import pytest

from kernels.methods.flash import bwd_gluon, fwd_gluon


_COMPILE = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from tests.compiled_report import report
from kernels.methods.flash import fwd_gluon as G

for case in sys.argv[1:]:
    D, BN, STAGES, causal, pingpong, persistent, overlap, consumers, *rest = (int(a) for a in case.split(","))
    lay = lambda rows: gl.NVMMASharedLayout.get_default_for([1, 1, rows, D], gl.bfloat16)  # noqa: E731
    desc = lambda rows: f"tensordesc<bf16[1,1,{rows},{D}],{lay(rows)}>"  # noqa: E731
    const = {"sod": 1, "BLOCK_M": 64, "BLOCK_N": BN, "D": D, "STAGES": STAGES, "CAUSAL": bool(causal),
             "PINGPONG": bool(pingpong), "Q_BUFS": 2 if persistent else 1, "LEVELS": bool(persistent and causal),
             "OVERLAP": bool(overlap), "SCALE_NONNEG": True, "CONSUMERS": consumers, "SUM_MMA": bool(rest and rest[0]),
             "KV_GROUP": 1}
    sig = {"desc_q": desc(64), "desc_k": desc(BN), "desc_v": desc(BN), "O": "*bf16", "LSE": "*fp32", "sob": "i32",
           "soh": "i32", "som": "i32", "H": "i32", "TQ": "i32", "TK": "i32", "qk_scale": "fp32", "n_m": "i32",
           "n_bh": "i32", "n_sec": "i32", **{k: "constexpr" for k in const}}
    src = GluonASTSource(fn=G._fwd_ws_kernel, signature=sig, constexprs=const,
                         attrs={(3,): [["tt.divisibility", 16]], (4,): [["tt.divisibility", 16]]})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    print(json.dumps({"case": case, **report(k, sass=bool(overlap))}))
"""


# every test here compiles Gluon kernels for sm_90 (3-8 s each on two cores): the slow set
pytestmark = pytest.mark.slow


def _check_compiled(k: dict, case: str, expects: set, budget: int, regs: int = 240, spills: bool = False) -> None:
    """What every Gluon flash kernel compiled for sm_90 must show: 4-D TMA loads, wgmma, the consumers'
    `regs` registers (setmaxnreg; 160 with three consumers), barriers that expect exactly `expects` bytes
    (the fixed tiles; a ring slot's tiles), every release one elected thread's arrive right after its
    warpgroup's bar.sync, its buffers (`budget` bytes, 1 KB of it scratch) within the H200's shared memory,
    no spill (unless `spills`: the caller bounds it)."""
    ptx = k["ptx"]
    assert "cp.async.bulk.tensor.4d" in ptx and "wgmma.mma_async" in ptx, case
    assert re.search(rf"setmaxnreg\.inc\.sync\.aligned\.u32\s+{regs}\b", ptx), case
    expect_tx = r"mbarrier\.arrive\.expect_tx\.shared(?:::cta)?\.b64 _, \[%r\d+\], (\d+);"
    assert {int(n) for n in re.findall(expect_tx, ptx)} == expects, case
    arrives = re.findall(r"^\s*(@%p\d+ )?mbarrier\.arrive\.shared(?:::cta)?\.b64.*$", ptx, re.M)
    assert arrives and all(a for a in arrives), (case, arrives)  # each predicated: one thread arrives
    _assert_released_after_the_warpgroup(ptx, case)
    assert budget - 1024 <= k["shared"] <= fwd_gluon.SHARED_LIMIT, case
    assert "ld.local" not in ptx and "st.local" not in ptx, case
    if k["usage"] and not spills:
        assert "LOCAL:0" in k["usage"] and "STACK:0" in k["usage"], (case, k["usage"])


def _assert_released_after_the_warpgroup(ptx: str, case: str) -> None:
    """Each slot release (one thread's mbarrier.arrive) comes right after a barrier of its 128 threads, so
    every warp of the consumer has passed its wgmma wait before the slot is handed back."""
    lines = [ln.strip() for ln in ptx.splitlines() if ln.strip() and not ln.strip().startswith(("//", ".loc"))]
    for i, ln in enumerate(lines):
        if re.match(r"(@%p\d+ )?mbarrier\.arrive\.shared(?:::cta)?\.b64", ln):
            before = lines[max(0, i - 4):i]
            assert any(re.match(r"bar\.sync\s+\d+,\s*128;", b) for b in before), (case, before, ln)


def test_gluon_forward_compiles_for_sm90_warp_specialized():
    """Compiled for Hopper without a GPU (tests.compiled_report: a subprocess without TRITON_INTERPRET, the
    Triton of HARNESS_COMPILE_PYTHON where set), ping-pong and free-running, with and without the overlap, a
    program a work tile and persistent, both head dims and tiles, two consumers and three at 160
    registers (d = 64, and d = 128 with 64-key tiles) (``_check_waits``: where the waits are):
    TMA loads of 4-D boxes whose barrier expects exactly a q tile's bytes and a k plus v tile's, wgmma,
    the consumers' registers set (setmaxnreg: 240, or 160 for three), every barrier release by one elected
    thread (the slots' barriers count one arrival per consumer, the others one), no spill, and the buffers
    within the H200's shared memory; with the row sums by the tensor cores (sum_mma), their n = 16 products."""
    from tests.compiled_report import compile_cases

    if fwd_gluon.GLUON_ERROR:
        pytest.skip(fwd_gluon.GLUON_ERROR)
    cases = ["64,128,3,1,1,0,1,2", "128,128,2,0,1,0,0,2", "64,128,2,1,1,1,1,2", "128,64,2,1,0,1,0,2",
             "64,128,2,1,0,1,1,2", "128,128,2,1,1,1,1,2", "64,64,3,1,1,1,1,3", "64,128,2,1,0,1,0,3",
             "64,64,2,0,0,0,1,3", "128,64,4,1,0,1,0,3", "64,128,3,1,0,1,0,3,1", "128,64,3,1,0,1,0,3,1",
             "64,128,2,0,0,0,0,2,1"]
    for case, k in zip(cases, compile_cases(_COMPILE, cases, timeout=900)):
        d, block_n, stages, _, _, persistent, overlap, consumers, *rest = (int(a) for a in case.split(","))
        sums = bool(rest and rest[0])
        _check_compiled(k, case, {64 * d * 2, 2 * block_n * d * 2},
                        fwd_gluon.shared_bytes(d, block_n, stages, bool(persistent), consumers, sums),
                        240 if consumers == 2 else 160)
        # sum_mma: the row sums as products with a 16-column tile of ones (wgmma n = 16), a thread's adds of p gone
        assert ("wgmma.mma_async.sync.aligned.m64n16k16" in k["ptx"]) == sums, case
        # each ring slot's release barrier counts every consumer; the rest (each consumer's q buffers' two, the
        # slots' ready ones, the turns) one arrival
        inits = re.findall(r"mbarrier\.init\.shared(?:::cta)?\.b64 \[%r\d+\], (\d+);", k["ptx"])
        q_bufs = 2 if persistent else 1
        assert sorted(inits) == sorted([str(consumers)] * stages + ["1"] * (stages + 2 * consumers * q_bufs
                                                                            + consumers)), (case, inits)
        _check_waits(k, case, bool(overlap), block_n)


def _check_waits(k: dict, case: str, overlap: bool, block_n: int) -> None:
    """The forward's wgmma waits: with ``overlap`` the consumers wait once for one product left outstanding (the
    q k^T issued before the previous tile's p v) and the p v only after the softmax, so a tile's exponentials
    come between the two waits; without it every wait is for all products."""
    waits = re.findall(r"wgmma\.wait_group\.sync\.aligned (\d+);", k["ptx"])
    assert waits and set(waits) == ({"0", "1"} if overlap else {"0"}), (case, sorted(set(waits)))
    if overlap:  # (a thread's share of a 64 x block_n tile: block_n / 2)
        assert _exponentials_between_waits(k) >= block_n // 2, (case, _exponentials_between_waits(k))


def _exponentials_between_waits(k: dict) -> int:
    """How many exponentials follow the first wait that leaves one product outstanding before the next wait for
    all: in the SASS where cuobjdump is there (ptxas may move a wait: the dq pass's moved up to its first
    exponential), else in the PTX."""
    if k["sass"]:
        one, zero, ex2 = "WARPGROUP.DEPBAR.LE gsb0, 0x1", "WARPGROUP.DEPBAR.LE gsb0, 0x0", "MUFU.EX2"
        text = k["sass"]
    else:
        one, zero, ex2 = "wgmma.wait_group.sync.aligned 1;", "wgmma.wait_group.sync.aligned 0;", "ex2.approx"
        text = k["ptx"]
    return text.split(one, 1)[1].split(zero, 1)[0].count(ex2)


_COMPILE_BWD = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from tests.compiled_report import report
from kernels.methods.flash import bwd_gluon as G

for case in sys.argv[1:]:
    D, BM, STAGES, causal, dq, *more = (int(a) for a in case.split(","))
    overlap, split, lpt = (more + [0, 0, 0])[:3]
    DQ_COLS = D // 2 if split else D
    lay = lambda rows, ty=gl.bfloat16: gl.NVMMASharedLayout.get_default_for([1, 1, rows, D], ty)  # noqa: E731
    desc = lambda rows: f"tensordesc<bf16[1,1,{rows},{D}],{lay(rows)}>"  # noqa: E731
    const = {"s_dkd": 1, "s_dvd": 1, "BLOCK_N": 64, "BLOCK_M": BM, "D": D, "STAGES": STAGES, "CAUSAL": bool(causal),
             "DQ": bool(dq), "OVERLAP": bool(overlap), "DQ_SPLIT": bool(split), "LPT": bool(lpt),
             "KV_GROUP": 1}
    sig = {"desc_k": desc(64), "desc_v": desc(64), "desc_q": desc(BM), "desc_do": desc(BM), "LSE": "*fp32",
           "DELTA": "*fp32", "DK": "*bf16", "DV": "*bf16", "s_dkb": "i32", "s_dkh": "i32", "s_dkn": "i32",
           "s_dvb": "i32", "s_dvh": "i32", "s_dvn": "i32", "H": "i32", "TQ": "i32", "TK": "i32", "qk_scale": "fp32",
           "scale": "fp32", "n_sec": "i32",
           "desc_dqa": (f"tensordesc<fp32[1,1,{BM},{DQ_COLS}],"
                        f"{gl.NVMMASharedLayout.get_default_for([1, 1, BM, DQ_COLS], gl.float32)}>" if dq else desc(64)),
           **{k: "constexpr" for k in const}}
    src = GluonASTSource(fn=G._dkdv_ws_kernel, signature=sig, constexprs=const,
                         attrs={(i,): [["tt.divisibility", 16]] for i in (4, 5, 6, 7)})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    print(json.dumps({"case": case, **report(k, sass=bool(overlap))}))
"""


def test_gluon_dkdv_compiles_for_sm90_warp_specialized():
    """The Gluon dk/dv pass compiled for Hopper as the forward is (see above): per query tile the barrier
    expects a q and a do tile's bytes, each consumer's k and v once; one elected arrive per release; the
    consumers' 240 registers; no spill at the plans the tests take (d = 64 with 64-query tiles, d = 128
    with 32), the d = 64 one also with the programs in LPT sections (``BwdPlan.lpt_mb``)."""
    from tests.compiled_report import compile_cases

    if fwd_gluon.GLUON_ERROR:
        pytest.skip(fwd_gluon.GLUON_ERROR)
    cases = ["64,32,3,1,0", "128,32,3,0,0", "128,32,2,1,0", "64,64,3,1,0,0,0,1"]  # (q + do and k + v tiles of
    # different sizes; the last in LPT sections)
    for case, k in zip(cases, compile_cases(_COMPILE_BWD, cases, timeout=900)):
        d, block_m, stages, *_ = (int(a) for a in case.split(","))  # k and v; q and do
        _check_compiled(k, case, {2 * 64 * d * 2, 2 * block_m * d * 2}, bwd_gluon.shared_bytes(d, block_m, stages))
        assert "cp.reduce.async.bulk" not in k["ptx"], case


def test_gluon_dkdv_adding_dq_compiles_for_sm90_with_ordered_reductions():
    """The dk/dv pass that adds dq (plan dq_mode="tma_add"), compiled for Hopper: the dk/dv kernel's protocol
    (above) and no spill at d = 64; each consumer's TMA reduction (a 4-D bulk tensor add, one thread) issued
    right after its warpgroup's barrier that follows the dq tile's stores and the async-proxy fence; before
    those stores, its previous reductions waited for (wait_group.read 0) and that barrier again; the ds^T
    tiles written (stmatrix) and fenced before the warpgroup's barrier and arrive that hand them over; one
    more wait for the reductions, where the consumers end. At d = 128 (which spills) turns and the split between
    the consumers (``dq_split``, the last case): each one's dq product half as wide (wgmma n = d / 2), both
    handing the ds^T slots back (their barriers count two, as the ds^T's own do). (How much each spills
    depends on the Triton: 48 bytes split against 96 by turns with 3.6, causal; 48 and 48 with 3.9.)"""
    from tests.compiled_report import compile_cases

    if fwd_gluon.GLUON_ERROR:
        pytest.skip(fwd_gluon.GLUON_ERROR)
    cases = ["64,64,2,1,1", "64,64,3,0,1", "128,64,2,1,1", "128,64,2,1,1,0,1"]
    compiled = compile_cases(_COMPILE_BWD, cases, timeout=900)
    for case, k in zip(cases, compiled):
        d, block_m, stages, _, _, *more = (int(a) for a in case.split(","))
        split = bool(more and more[1])
        _check_compiled(k, case, {2 * 64 * d * 2, 2 * block_m * d * 2},
                        bwd_gluon.shared_bytes(d, block_m, stages, dq=True, dq_split=split), spills=d == 128)
        counts = re.findall(r"mbarrier\.init\.shared(?:::cta)?\.b64 \[%r\d+\], (\d+);", k["ptx"])
        # count 2: the ring's slots (both consumers release them), ds^T's full pair, with split its empty pair too
        assert counts.count("2") == stages + (4 if split else 2), (case, counts)
        lines = [ln.strip() for ln in k["ptx"].splitlines()
                 if ln.strip() and not ln.strip().startswith(("//", ".loc", "$", "{", "}", ".reg"))]
        reductions = [i for i, ln in enumerate(lines) if re.match(
            r"@%p\d+ cp\.reduce\.async\.bulk\.tensor\.4d\.global\.shared::cta\.(bulk_group\.)?add", ln)]
        assert len(reductions) == 2, (case, len(reductions))  # one per consumer
        for i in reductions:
            before = lines[:i]
            bar = max(j for j, ln in enumerate(before) if re.match(r"bar\.sync\s+\d+,\s*128;", ln))
            fence = max(j for j, ln in enumerate(before) if ln.startswith("fence.proxy.async"))
            store = max(j for j, ln in enumerate(before) if ln.startswith("st.shared"))
            wait = max(j for j, ln in enumerate(before) if re.match(r"cp\.async\.bulk\.wait_group\.read\s+0;", ln))
            assert wait < store < fence < bar < i, (case, wait, store, fence, bar, i)
            assert any(re.match(r"bar\.sync\s+\d+,\s*128;", ln) for ln in lines[wait + 1:wait + 3]), case
        def event(ln):
            return ("stmatrix" if ln.startswith("stmatrix") else "fence" if ln.startswith("fence.proxy.async") else
                    "bar" if re.match(r"bar\.sync\s+\d+,\s*128;", ln) else
                    "arrive" if re.match(r"@%p\d+ mbarrier\.arrive", ln) else None)

        events = [(i, event(ln)) for i, ln in enumerate(lines) if event(ln)]
        hand_overs = [n for n, (_, e) in enumerate(events) if e == "stmatrix"
                      and (n + 1 == len(events) or events[n + 1][1] != "stmatrix")]  # each ds^T tile's last store
        assert len(hand_overs) == 2, case  # one per consumer
        for n in hand_overs:  # then the fence, the warpgroup's barrier, one thread's arrive
            assert [e for _, e in events[n + 1:n + 4]] == ["fence", "bar", "arrive"], (case, events[n:n + 4])
        waits = [ln for ln in lines if re.match(r"cp\.async\.bulk\.wait_group\.read\s+0;", ln)]
        assert len(waits) > len(reductions), case  # (and at the end: the consumers' exits may share their code)
    turns, split = compiled[2], compiled[3]

    def products(k, n):
        return len(re.findall(rf"wgmma\.mma_async\.sync\.aligned\.m64n{n}k16", k["ptx"]))

    # the dq product: 64 x 128 by turns, 64 x 64 split (s^T's and dp^T's are 64 x 64 in both)
    assert products(split, 64) > products(turns, 64) and products(split, 128) < products(turns, 128)


def test_compile_check_reports_the_gluon_kernels_of_gluon_plans():
    """``python -m harness.bench flash-compile-check`` with Gluon plans compiles the Gluon kernels they launch
    (here the ping-pong forward and the dk/dv pass adding dq) for sm_90 and reports each: warp-specialized,
    no spill at d = 64, the dq reductions."""
    from tests.compiled_report import compile_run

    if fwd_gluon.GLUON_ERROR:
        pytest.skip(fwd_gluon.GLUON_ERROR)
    run = compile_run(["-m", "harness.bench", "flash-compile-check", "--d", "64",
                       "--fwd", "gluon=2 block_m=128 block_n=128 num_stages=2 sum_mma=0",
                       "--bwd", "gluon=1 block_n1=128 block_m1=64 num_stages=2 dq_mode=tma_add"], 600)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = {ln.strip().split(" (Gluon)")[0]: ln for ln in run.stdout.splitlines() if "(Gluon)" in ln}
    assert set(lines) == {"forward", "dk/dv + dq"}, run.stdout  # (no Triton dq pass: dq is added)
    for line in lines.values():
        assert "0 B spill stack" in line and "warp-specialized True" in line and "FAILED" not in line, line
    assert "cp.reduce.async.bulk.tensor.4d" in lines["dk/dv + dq"], lines["dk/dv + dq"]


_COMPILE_DQ = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from tests.compiled_report import report
from kernels.methods.flash import bwd_gluon_dq as G

for case in sys.argv[1:]:
    D, BN, STAGES, causal, delta, *lpt = (int(a) for a in case.split(","))
    lay = lambda rows: gl.NVMMASharedLayout.get_default_for([1, 1, rows, D], gl.bfloat16)  # noqa: E731
    desc = lambda rows: f"tensordesc<bf16[1,1,{rows},{D}],{lay(rows)}>"  # noqa: E731
    const = {"s_dqd": 1, "s_od": 1, "BLOCK_M": 64, "BLOCK_N": BN, "D": D, "STAGES": STAGES, "CAUSAL": bool(causal),
             "DELTA_IN_DQ": bool(delta), "LPT": bool(lpt and lpt[0]),
             "KV_GROUP": 1}
    sig = {"desc_q": desc(64), "desc_do": desc(64), "desc_k": desc(BN), "desc_v": desc(BN), "LSE": "*fp32",
           "DELTA": "*fp32", "DQ": "*bf16", "s_dqb": "i32", "s_dqh": "i32", "s_dqm": "i32", "s_dqd": "constexpr",
           "O": "*bf16", "s_ob": "i32", "s_oh": "i32", "s_om": "i32", "H": "i32", "TQ": "i32", "TK": "i32",
           "qk_scale": "fp32", "scale": "fp32", "n_sec": "i32", **{k: "constexpr" for k in const}}
    src = GluonASTSource(fn=G._dq_ws_kernel, signature=sig, constexprs=const,
                         attrs={(i,): [["tt.divisibility", 16]] for i in (4, 5, 6, 7, 8, 9, 11, 12, 13, 14)})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    print(json.dumps({"case": case, **report(k)}))
"""


def test_gluon_dq_compiles_for_sm90_warp_specialized():
    """The Gluon dq pass compiled for Hopper as the others: per key tile the barrier expects a k and a v
    tile's bytes, each consumer's q and do once; one elected arrive per release; 240 registers; no spill.
    Forming delta (DELTA_IN_DQ, the table's d = 128 plan): o read from global memory as 16-byte vectors (the
    strides divisible by 16, as the launch specializes them), which the pass reading delta does not read. The
    table's d = 128 plan also with the programs in LPT sections (``BwdPlan.lpt_mb``)."""
    from tests.compiled_report import compile_cases

    if fwd_gluon.GLUON_ERROR:
        pytest.skip(fwd_gluon.GLUON_ERROR)
    cases = ["64,128,2,1,0", "128,64,3,0,0", "128,128,2,1,0", "128,64,3,1,1", "64,128,2,1,1", "128,64,3,1,1,1"]
    for case, k in zip(cases, compile_cases(_COMPILE_DQ, cases, timeout=900)):
        d, block_n, stages, _, delta, *_ = (int(a) for a in case.split(","))  # q and do; k and v
        _check_compiled(k, case, {2 * 64 * d * 2, 2 * block_n * d * 2}, bwd_gluon.shared_bytes(d, block_n, stages))
        o_loads = re.findall(r"\bld\.global(?:\.\w+)*\.v4\.b32\b", k["ptx"])  # (lse and delta: scalar fp32)
        assert len(o_loads) == (2 * 64 * d * 2 // (128 * 16) if delta else 0), (case, len(o_loads))


def test_gluon_backward_overlap_compiles_for_sm90_waiting_for_what_comes_next():
    """BwdPlan.overlap compiled for Hopper: the dk/dv pass (with and without adding dq) keeps the protocol above
    and spills nothing at the tiles the sweep tries (d = 64 with 64-query tiles, d = 128 with 32); one of its
    waits leaves dp^T outstanding, and p^T's exponentials come after it, before the wait for all products."""
    from tests.compiled_report import compile_cases

    if fwd_gluon.GLUON_ERROR:
        pytest.skip(fwd_gluon.GLUON_ERROR)
    cases = ["64,64,2,1,0,1", "64,64,2,1,1,1", "128,32,2,1,0,1"]
    for case, k in zip(cases, compile_cases(_COMPILE_BWD, cases, timeout=900)):
        d, block_m, stages, _, dq, _ = (int(a) for a in case.split(","))
        _check_compiled(k, case, {2 * 64 * d * 2, 2 * block_m * d * 2},
                        bwd_gluon.shared_bytes(d, block_m, stages, dq=bool(dq)))
        waits = re.findall(r"wgmma\.wait_group\.sync\.aligned (\d+);", k["ptx"])
        assert "1" in waits and "0" in waits, (case, sorted(set(waits)))
        # (a thread's share of a 64-key x block_m tile: block_m / 2)
        assert _exponentials_between_waits(k) >= block_m // 2, (case, _exponentials_between_waits(k))


def test_compile_check_of_grouped_heads_compiles_the_kernels_they_run():
    """``--heads 14:2`` (Qwen2.5's grouped heads): the plans the launchers run there (the Triton forward, the unfused
    dk/dv and dq passes, while the Gluon kernels' grouped path awaits its GPU check), each compiled for sm_90; with
    ``--gluon-grouped`` the table's Gluon kernels at d = 64 (the forward, the dk/dv pass adding dq) with KV_GROUP =
    7, spilling nothing; a bad --heads is refused saying what is accepted."""
    from tests.compiled_report import compile_run

    run = compile_run(["-m", "harness.bench", "flash-compile-check", "--d", "64", "--heads", "14:2"], 600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "14 query heads on 2 key/value heads" in run.stdout
    parts = [ln.split()[0] for ln in run.stdout.splitlines() if "registers" in ln]
    assert parts == ["forward", "dk/dv", "dq"] and "Gluon" not in run.stdout and "FAILED" not in run.stdout, run.stdout
    if not fwd_gluon.GLUON_ERROR:
        run = compile_run(["-m", "harness.bench", "flash-compile-check", "--d", "64", "--heads", "14:2",
                           "--gluon-grouped"], 600)
        assert run.returncode == 0, run.stderr[-2000:]
        lines = [ln.strip() for ln in run.stdout.splitlines() if "registers" in ln]
        assert [ln.split(" 3 slots")[0] for ln in lines] == ["forward (Gluon)", "dk/dv + dq (Gluon)"], run.stdout
        assert all(" 0 B spill" in ln for ln in lines) and "FAILED" not in run.stdout, run.stdout
    bad = compile_run(["-m", "harness.bench", "flash-compile-check", "--d", "64", "--heads", "14:3"], 120)
    assert bad.returncode == 2 and "Hkv dividing H" in bad.stderr
