"""`flash`: the project's own fused attention in Triton, forward and backward; the online-softmax
rung, where the Tq x Tk scores never exist in memory.

Code paths (each module opens with its own details):

* Forward (``fwd``): one program per (BLOCK_M queries, head, batch). q stays on chip; the loop
  streams BLOCK_N keys and values: s = q k^T (fp32), the running max m and sum l per row, p =
  exp2(s * scale * log2(e) - m) (the scale folded into the exponent's base change), the fp32 output
  accumulator rescaled by exp2(m_old - m_new), o += p v with p rounded to the input dtype. The key
  loop is split by its bounds: blocks every query of the program sees run without a mask; the
  diagonal blocks (and the last, partial block of keys) get the causal / boundary mask; blocks above
  the diagonal are never visited. The masked blocks run in a second loop, or (plan ``one_loop``, the
  table's at T <= 1024) inside the first under a branch, so their loads are prefetched with the rest
  (+5% forward at (16, 12, 1024, 64), measured on an H100 (docs/perf.md); the backward's loops likewise,
  +2%). Written: out (in the (B, T, H, d) memory layout) and the natural log-sum-exp per query row
  (fp32). A query with no key (causal, Tq > Tk) gets out = 0 and lse = +inf, so the backward's
  exp(s - lse) is exactly 0 (zero gradient, no NaN).
* Forward in Gluon (``fwd_gluon``, plan ``FwdPlan.gluon``; Hopper, 16-bit, d = dv in {64, 128}):
  FA3's structure, warp-specialized: a producer partition streams k and v tiles by TMA through a
  ring of shared-memory slots, two consumer warpgroups of 64 queries each (three with ``block_m=192``:
  d = 64, or d = 128 with 64-key tiles) run q k^T, the online softmax and p v (same masking and outputs
  as above); with ``gluon=2`` they take turns at issuing their products (FA3's ping-pong), so one's
  softmax overlaps the others' wgmmas, with ``gluon=1`` they run free; with ``overlap`` each runs a
  tile's softmax under its previous tile's p v; with ``persistent`` a program per SM loops over the work
  tiles, loading the next one's q and key tiles under this one's math (causal: heaviest blocks first,
  with ``section_mb`` a section of heads at a time, their keys and values kept in L2). An explicit plan
  it cannot take refuses with the reason; a table plan falls back to the Triton kernel's measured plan
  (``plan.triton_plans``). Measured on an H100 (docs/perf.md): three consumers +6-8% over two at d = 64,
  1.07x cuDNN at (4, 12, 4096, 64) (the table's entry beyond T = 1024); at (8, 16, 2048, 128) three
  consumers with 64-key steps and 32 MB sections 1.46x two consumers with 128-key steps, 0.89x cuDNN in
  the sweep (the table's d = 128 entry: without sections the keys and values of all 128 heads were
  read from memory again for every query block); ``overlap`` and ping-pong lost to free-running
  consumers at every shape (-2% to -14%); with ``sum_mma`` the row sums come from the tensor cores
  (p times a tile of ones beside p v): +1.6-3.5% at d = 64 beyond T = 1024 (in the table there).
  Its consumers are in ``fwd_gluon_consumers``, its work-tile schedule in ``fwd_gluon_schedule``.
* ``gluon_common``: what the Gluon kernels share (wgmma layouts, program prologues, ring barriers, masks,
  which inputs they take, their TMA descriptors).
* The backward in Gluon (``bwd_gluon``, plan ``BwdPlan.gluon``; what the Gluon forward takes): the
  same structure. The dk/dv pass (``gluon=1``, 2): a producer streams the q and do tiles by TMA, two
  consumer warpgroups of 64 keys each run the transposed recurrence below; the dq pass (``gluon=2``,
  ``bwd_gluon_dq``): the producer streams k and v, two consumers of 64 queries each. The delta kernel stays Triton's (and
  the dq pass with ``gluon=1``); with ``delta_in_dq`` the dq pass, Triton's or the Gluon one, forms delta
  instead and runs first. With ``gluon=1, dq_mode="tma_add"`` there is no dq pass: FA3's
  backward, the dk/dv kernel adds dq itself (the consumers take turns forming each query tile's share
  over the program's 128 keys from their ds^T in shared memory, one TMA reduction per tile into an
  fp32 buffer the delta kernel zeroed; the dq pass instead under deterministic algorithms). In the
  table: ``gluon=1, dq_mode="tma_add"`` for d = 64 beyond T = 1024 (+6% forward + backward at
  (4, 12, 4096, 64) over the Triton passes, on an H200), ``gluon=2`` with ``delta_in_dq`` at d = 128
  (+5% on an H200; no delta kernel: 30-36 us less kernel time by Nsight Compute on an H100). With
  ``overlap`` the dk/dv consumers issue dp^T with s^T and wait only for the product needed next; with
  ``lpt_mb`` the programs start in FA3's LPT order (sections of heads, every head's heaviest block
  first). The d = 64 entry beyond T = 1024 takes both (+6% forward + backward at (4, 12, 4096, 64),
  0.98x cuDNN, on an H100), d = 128 the overlap (+2%; +4% with delta spread over the accumulator's
  columns only where ds^T needs it, which took the dk/dv pass's loop off its spill: 0.95-0.96x cuDNN).
* Backward (``bwd``): delta = rowsum(o * do) (a small kernel); a dk/dv kernel (a program per
  BLOCK_N1 keys, looping over the queries that see them, diagonal blocks masked) and a dq kernel (a
  program per BLOCK_M2 queries, looping over their keys); both recompute P = exp2(s * c - lse *
  log2(e)) from q, k and lse; dS = P * (dP - delta) with dP = do v^T; dv = P^T do, dk = scale *
  dS^T q, dq = scale * dS k. No Tq x Tk tensor. The two run as two launches or one fused launch
  (plan ``fused``); with plan ``delta_in_dq`` the dq pass forms delta for its rows (it reads do anyway,
  and o once) and runs first, and there is no delta kernel (the Triton dq pass: +2.7% forward +
  backward at (4, 12, 4096, 64), -0.5% at d = 128, on an H200; the Gluon one at d = 128: 0 to +1.6% in
  H100 sweeps, 30-36 us less kernel time; the table's). With plan ``dq_mode="atomic"`` (FA2's structure)
  there is no dq pass: the dk/dv
  programs add each tile's scale * dS k into an fp32 dq buffer by atomic adds (five matmuls per tile
  pair instead of seven; dq's summation order then varies from run to run), cast once at the end.
  Measured slower than the dq pass at every swept shape on an H200 (docs/perf.md: the atomics cost
  more than the two matmuls they save), so no table entry uses it; the sweep still tries it. Plan
  ``dq_mode="tma_add"`` (FA3's structure) adds each tile's share by one TMA reduction instead
  (``cp.reduce.async.bulk.tensor`` through a descriptor of the buffer). Compiled for sm_90 with the
  T > 1024, d = 64 table plan: 174 registers against 200 for the element atomics under Triton 3.6
  (162 against 160 under 3.9); at d = 128 (8-warp 64 x 128) 255 with a 112 B spill, as the pass plan
  there. Measured slower than the dq pass too (252 against 310 TFLOP/s forward + backward at
  (4, 12, 4096, 64) on an H200: each key block reduces a share into every later dq row, 1.6 GB of fp32
  reductions at that shape with 64-key tiles).
* Grouped-query attention (k and v with Hkv heads, H % Hkv == 0; query head h reads kv head h // G, G = H /
  Hkv, SDPA's ``enable_gqa`` convention): native in the Triton kernels, k and v never expanded. The forward
  and the dq pass read kv head h // G through k's and v's own strides (constexpr ``KV_GROUP`` = G, default
  1: without groups the kernels compile to the same PTX as before, checked for sm_90 with the table's Triton
  plans); the dk/dv pass runs one program per (key block, kv head, batch), loads its k and v block once and
  loops over the G query heads of its group and their query blocks, summing dk and dv on chip (no expanded
  gradient buffers, no atomics); delta per query head as before. ``delta_in_dq``, ``one_loop``, the atomic
  dq modes and the deterministic path take groups as they are (the dq sums stay per query head). The Gluon
  kernels the same way (``KV_GROUP``): the forward's producer and the Gluon dq pass load kv head h // G, a
  Gluon dk/dv program streams the query tiles of its G heads one head after another (adding each head's dq
  share by TMA where the plan says so). The fused backward (one grid whose axis 1 cannot be both the kv and the
  query heads) takes Hkv = H only: a table plan runs unfused, an explicit plan refuses with the reason.
* Gradients: in their input's strides where that input is dense (a leaf's ``.grad`` then takes them as
  they are: autograd copies a gradient whose strides differ from its dense leaf's, three B H T d copies a
  backward on contiguous (B, H, T, d) inputs), else (a view of a projection: the model's) laid out as (B,
  T, H, d) (``tiles.empty_grad``).
* Any strides: every tensor is addressed through its own (B, H, T, d) strides; the model's (B, T, H,
  d) views are read in place, never copied. Head dims 1..128, padded to the next power of two
  (>= 16) with masked loads; dv may differ from d. float16 / bfloat16 (tensor cores, fp32
  accumulation); float32 with full-precision (``ieee``) dots: correct to the fp32 tolerance, slow.

Bytes and FLOPs: forward reads q, k, v and writes out and lse: (B H)(Tq d + 2 Tk d + Tq dv) elements
once per query block for k and v (re-read from L2 by each of the cdiv(Tq, BLOCK_M) programs of a
head); 4 B H Tq Tk d FLOPs (half for causal Tq = Tk). Backward: 2.5x the forward's FLOPs (five
matmuls instead of two; recomputing P is one of them), plus reads of do, out, lse, delta. So it is
compute-bound on an H200 for T >= a few hundred: the target is tensor-core throughput (anchors:
SDPA flash 192 / FlexAttention 225 / cuDNN 303 TFLOP/s forward at (16, 12, 1024, 64) causal bf16).

Causal programs start heaviest first: head by head (the default), or by groups of heads (plan
``FwdPlan.group``: every group's heaviest query blocks first, so the grid ends on its lightest ones).

Hopper features, each a switch of the launch plan (``plan``; measured by ``sweep``): ``tma``
("off": pointer loads, pipelined with cp.async; "host": tensor descriptors built on the host and
passed as kernel parameters, loaded by TMA into shared memory with mbarriers, which frees the
registers and address arithmetic of the loads and fills/clips the ragged tiles in hardware;
"device": descriptors built in the kernel by tl.make_tensor_descriptor, no host work per call, a
scratch allocation instead); ``num_stages`` (how many key (forward, dq) or query (dk/dv) tiles are
in flight ahead of the math: software pipelining); ``warp_specialize`` (tl.range(...,
warp_specialize=True): Triton splits the loop into producer warps that issue the loads and consumer
warpgroups that run wgmma and the softmax, FA3's structure); BLOCK_M / BLOCK_N and num_warps (tile
shape vs registers and occupancy: 128-row tiles feed wgmma's 64-row instructions twice per warp
group). TMA needs 16-byte aligned bases and strides; other inputs take the pointer path.
Compiled for sm_90 by Triton 3.6 (``compile_check``, no GPU needed): every path lowers to wgmma;
TMA copies replace the pointer loads and take 20-50 fewer registers a thread; warp_specialize
leaves these loops unspecialized on Hopper (same code with 8 warps; with 4 the pass fails to
compile), so on 3.6 it is a Blackwell switch.

Launches go through ``kernels.runtime.fastlaunch`` (Triton's launcher skipped once a
specialization is known: ~20 us less per forward on the H200's host); the forward's launch and the
dq-pass backward's (pointer tiles) are kept prepared by shapes, strides, dtypes, device, scale and
causality (``fastlaunch.Prepared``), so a repeated call skips the plan and the argument tuples. The Gluon
plans' launches, whose TMA descriptors hold their tensors, are kept the same way by ``replay``: each
argument traced to the call's tensors, the descriptors rebuilt from a later call's own
(``fastlaunch.PreparedSlots``), so a repeat also skips the input checks and the specialization key.

Registered as the torch ops ``softmax_harness::flash_attention_fwd`` (-> out, lse) and
``softmax_harness::flash_attention_bwd`` (``ops``); ``attention_qkv`` (``qkv``) runs the same kernels on
views of one projection (B, T, (H + 2 Hkv) d), ``n_kv_head`` Hkv (default H), and writes the three gradients
into one tensor (no concatenation after them). Dropout is refused (sdpa or a composed method
drops out). Inputs: CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1`` (tests).
"""

from __future__ import annotations

from kernels.methods.flash.ops import flash_attention, unavailable_reason, validate
from kernels.methods.flash.qkv import flash_attention_qkv
from kernels.registry import Method, register

register(
    Method(
        name="flash",
        attention=flash_attention,
        attention_qkv=flash_attention_qkv,
        summary="the project's fused attention in Triton (online softmax, forward and backward; scores never stored)",
        unavailable_reason=unavailable_reason,
        validate=validate,
    )
)
