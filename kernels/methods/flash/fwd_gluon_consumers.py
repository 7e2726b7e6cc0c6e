"""The Gluon forward's consumer warpgroups (``fwd_gluon``): per work tile, each owns BLOCK_M = 64 queries and
runs q k^T, the online softmax and p v over the key tiles the producer streams, then stores its rows.
``_consumer`` runs free, each product waited for at once; ``_consumer_lagged`` issues a tile's p v behind the
next tile's q k^T (with OVERLAP the softmax runs under that p v; with PINGPONG the consumers take turns at
issuing). The module docstring of ``fwd_gluon`` says why each exists and how they were measured."""

from __future__ import annotations

from kernels.methods.flash.fwd_gluon_schedule import _tile_count, _tile_of, _work_tile
from kernels.methods.flash.gluon_common import (_key_range, _mask_tile, gl, gluon, mbarrier, mma_layout,
                                                operand_layout, warpgroup_mma, warpgroup_mma_wait)

# (defined below where Gluon is)
_softmax_tile = _masked_step = _store_rows = _tile_start = _consumer = _consumer_lagged = _consumer_of = None

if gluon is not None:

    @gluon.jit
    def _softmax_tile(sc, m_i, l_i, offs_m, n0, full, TQ, TK, qk_scale, BLOCK_N: gl.constexpr,
                      CAUSAL: gl.constexpr, SCALE_NONNEG: gl.constexpr, SUM: gl.constexpr = True):
        """One key tile's online-softmax step from its raw scores sc: (p, alpha, m, l); a row with no key yet
        keeps m = -inf and adds exactly 0. A tile every query sees whole (before `full`) with a scale >= 0 takes
        the max of the raw scores (max(s * c) = max(s) * c) and one FMA a score (s * c - m) before its
        exponential, as the Triton forward's SCALE_NONNEG: a multiply a score fewer."""
        if SCALE_NONNEG:
            if n0 + BLOCK_N <= full:
                m_new = gl.maximum(m_i, gl.max(sc, axis=1) * qk_scale)  # (finite: the tile's scores are)
                p = gl.exp2(sc * qk_scale - m_new[:, None])
                alpha = gl.exp2(m_i - m_new)
            else:
                p, alpha, m_new = _masked_step(sc, m_i, offs_m, n0, full, TQ, TK, qk_scale, BLOCK_N, CAUSAL)
        else:
            p, alpha, m_new = _masked_step(sc, m_i, offs_m, n0, full, TQ, TK, qk_scale, BLOCK_N, CAUSAL)
        if SUM:
            l_i = l_i * alpha + gl.sum(p, axis=1)
        return p, alpha, m_new, l_i  # (SUM False: l as it was, the caller sums by its products)

    @gluon.jit
    def _masked_step(sc, m_i, offs_m, n0, full, TQ, TK, qk_scale, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
        """(p, alpha, m) of a tile scaled first, then masked where it needs it (``_mask_tile``)."""
        z = _mask_tile(sc * qk_scale, offs_m, n0, full, TQ, TK, BLOCK_N, CAUSAL)
        m_new = gl.maximum(m_i, gl.max(z, axis=1))
        m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)  # no key yet: exp2(-inf) = 0
        return gl.exp2(z - m_ref[:, None]), gl.exp2(m_i - m_ref), m_new

    @gluon.jit
    def _store_rows(acc, m_i, l_i, O, LSE, sob, soh, som, sod, b, h, H, r0, TQ, BLOCK_M: gl.constexpr,
                    BLOCK_N: gl.constexpr, D: gl.constexpr):
        """out = acc / l in the output's own strides and lse (natural log) for queries r0 .. r0 + BLOCK_M
        from 0 and below Tq (``_work_tile``: a causal three-consumer block may start before 0); a row with no
        key: out 0, lse +inf (the backward's exp(s - lse) is then 0)."""
        o_layout: gl.constexpr = mma_layout(D)
        empty = l_i == 0.0
        lse = gl.where(empty, float("inf"), (m_i + gl.log2(gl.where(empty, 1.0, l_i))) * 0.6931471805599453)
        offs_m = r0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, mma_layout(BLOCK_N)))
        gl.store(LSE + (b * H + h).to(gl.int64) * TQ + offs_m, lse, mask=(offs_m >= 0) & (offs_m < TQ))
        inv = gl.convert_layout(1.0 / gl.where(empty, 1.0, l_i), gl.SliceLayout(1, o_layout))
        rows = r0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
        cols = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
        ptrs = (O + b.to(gl.int64) * sob + h.to(gl.int64) * soh + rows[:, None].to(gl.int64) * som
                + cols[None, :] * sod)
        gl.store(ptrs, (acc * inv[:, None]).to(O.dtype.element_ty), mask=(rows[:, None] >= 0) & (rows[:, None] < TQ))

    @gluon.jit
    def _tile_start(it, q_bar, n_m, n_bh, n_sec, H, TQ, TK, C: gl.constexpr, BLOCK_M: gl.constexpr,
                    BLOCK_N: gl.constexpr, Q_BUFS: gl.constexpr, CAUSAL: gl.constexpr, LEVELS: gl.constexpr,
                    CONSUMERS: gl.constexpr):
        """Consumer C's start of its program's it-th work tile: (b, h, the tile's key tiles, its first query r0,
        its keys' bounds hi and full (``_key_range``), its q buffer once the q tile is there)."""
        b, h, m0, n_tiles = _work_tile(_tile_of(it), n_m, n_bh, n_sec, H, TQ, TK, BLOCK_M, BLOCK_N, CAUSAL, LEVELS,
                                       CONSUMERS)
        r0 = m0 + C * BLOCK_M
        hi, full = _key_range(r0, TQ, TK, BLOCK_M, BLOCK_N, CAUSAL)
        qs = (it % Q_BUFS) * CONSUMERS + C
        mbarrier.wait(q_bar.index(qs), (it // Q_BUFS) & 1)
        return b, h, n_tiles, r0, hi, full, qs

    @gluon.jit
    def _consumer(q_bufs, k_bufs, v_bufs, q_bar, q_empty, kv_ready, kv_empty, ones, O, LSE, sob, soh, som, sod, n_m,
                  n_bh, n_sec, H, TQ, TK, qk_scale, C: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                  D: gl.constexpr, STAGES: gl.constexpr, Q_BUFS: gl.constexpr, CAUSAL: gl.constexpr,
                  LEVELS: gl.constexpr, SCALE_NONNEG: gl.constexpr, CONSUMERS: gl.constexpr, SUM_MMA: gl.constexpr):
        """A consumer running free: per key tile, q k^T, the softmax, p v, each waited for at once; its q
        buffer handed back once its work tile's key tiles are done, then the tile's rows stored. SUM_MMA: the row
        sums by the tensor cores, p times ``ones`` (a shared BLOCK_N x 16 tile of ones) into a 64 x 16 tile beside
        p v, instead of a reduction of p."""
        dtype: gl.constexpr = q_bufs.dtype
        s_layout: gl.constexpr = mma_layout(BLOCK_N)
        o_layout: gl.constexpr = mma_layout(D)
        zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
        kv = 0
        for it in range(_tile_count(n_m * n_bh)):
            b, h, n_tiles, r0, hi, full, qs = _tile_start(it, q_bar, n_m, n_bh, n_sec, H, TQ, TK, C, BLOCK_M,
                                                          BLOCK_N, Q_BUFS, CAUSAL, LEVELS, CONSUMERS)
            offs_m = r0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
            m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
            l_i = gl.zeros([BLOCK_M], gl.float32, layout=gl.SliceLayout(1, s_layout))
            acc = gl.zeros([BLOCK_M, D], gl.float32, layout=o_layout)
            l_acc = gl.zeros([BLOCK_M, 16], gl.float32, layout=mma_layout(16))
            q = q_bufs.index(qs).reshape([BLOCK_M, D])
            for j in range(n_tiles):
                s = (kv + j) % STAGES
                mbarrier.wait(kv_ready.index(s), ((kv + j) // STAGES) & 1)
                n0 = j * BLOCK_N
                if n0 < hi:
                    k = k_bufs.index(s).reshape([BLOCK_N, D])
                    v = v_bufs.index(s).reshape([BLOCK_N, D])
                    sc = warpgroup_mma(q, k.permute((1, 0)), zero_s, use_acc=False, is_async=True)
                    sc = warpgroup_mma_wait(num_outstanding=0, deps=(sc,))
                    p, alpha, m_i, l_i = _softmax_tile(sc, m_i, l_i, offs_m, n0, full, TQ, TK, qk_scale, BLOCK_N,
                                                       CAUSAL, SCALE_NONNEG, not SUM_MMA)
                    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
                    p_op = gl.convert_layout(p.to(dtype), operand_layout(D))
                    acc = warpgroup_mma(p_op, v, acc, is_async=True)
                    if SUM_MMA:
                        l_acc = l_acc * gl.convert_layout(alpha, gl.SliceLayout(1, mma_layout(16)))[:, None]
                        l_acc = warpgroup_mma(gl.convert_layout(p_op, operand_layout(16)), ones, l_acc, is_async=True)
                        acc, l_acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, l_acc))
                    else:
                        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
                mbarrier.arrive(kv_empty.index(s), count=1)
            mbarrier.arrive(q_empty.index(qs), count=1)
            kv += n_tiles
            if SUM_MMA:  # (its 16 equal columns)
                l_i = gl.convert_layout(gl.max(l_acc, axis=1), gl.SliceLayout(1, s_layout))
            _store_rows(acc, m_i, l_i, O, LSE, sob, soh, som, sod, b, h, H, r0, TQ, BLOCK_M, BLOCK_N, D)

    @gluon.jit
    def _consumer_lagged(q_bufs, k_bufs, v_bufs, q_bar, q_empty, kv_ready, kv_empty, turn, O, LSE, sob, soh, som, sod,
                         n_m, n_bh, n_sec, H, TQ, TK, qk_scale, C: gl.constexpr, BLOCK_M: gl.constexpr,
                         BLOCK_N: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr, Q_BUFS: gl.constexpr,
                         CAUSAL: gl.constexpr, LEVELS: gl.constexpr, SCALE_NONNEG: gl.constexpr,
                         PINGPONG: gl.constexpr, OVERLAP: gl.constexpr, CONSUMERS: gl.constexpr):
        """A consumer whose p v lags a tile behind: step t issues tile t's q k^T and then tile t - 1's p v (FA3's
        schedule). With OVERLAP it waits for the q k^T alone, runs tile t's softmax while its p v runs on the
        tensor cores, and only then waits for that p v (FA3's intra-warpgroup overlap; the previous p stays in
        registers until then); without it, for both before the softmax. With PINGPONG the consumers take
        turns at issuing, round the CONSUMERS (mbarriers ``turn``: consumer C waits on turn[C] and arrives on
        turn[C + 1] as soon as its wgmmas are issued, FA3's warp-scheduler barrier), so the tensor cores run one
        consumer's products queued behind another's while that one's softmax runs. Every consumer takes
        n_tiles + 1 steps a work tile (the last one for the last p v), with or without work in them, so the
        turns go round to the end (their count g goes on across work tiles); a tile's slot is released in the
        step after its q k^T, once its p v has run too."""
        dtype: gl.constexpr = q_bufs.dtype
        s_layout: gl.constexpr = mma_layout(BLOCK_N)
        o_layout: gl.constexpr = mma_layout(D)
        zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
        kv = 0
        g = 0
        for it in range(_tile_count(n_m * n_bh)):
            b, h, n_tiles, r0, hi, full, qs = _tile_start(it, q_bar, n_m, n_bh, n_sec, H, TQ, TK, C, BLOCK_M,
                                                          BLOCK_N, Q_BUFS, CAUSAL, LEVELS, CONSUMERS)
            n_mine = gl.minimum((hi + BLOCK_N - 1) // BLOCK_N, n_tiles)  # the tiles this consumer computes: a prefix
            offs_m = r0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
            m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
            l_i = gl.zeros([BLOCK_M], gl.float32, layout=gl.SliceLayout(1, s_layout))
            acc = gl.zeros([BLOCK_M, D], gl.float32, layout=o_layout)
            p_op = gl.zeros([BLOCK_M, BLOCK_N], dtype, layout=operand_layout(D))  # the previous tile's p, for p v
            q = q_bufs.index(qs).reshape([BLOCK_M, D])
            for t in range(n_tiles + 1):
                s = (kv + t) % STAGES
                prev = (kv + t + STAGES - 1) % STAGES
                if t < n_tiles:
                    mbarrier.wait(kv_ready.index(s), ((kv + t) // STAGES) & 1)
                if PINGPONG:
                    if C == 0:  # (its first turn passes at once; consumer C > 0's k-th waits for C - 1's k-th)
                        mbarrier.wait(turn.index(C), ((g + t) & 1) ^ 1)
                    else:
                        mbarrier.wait(turn.index(C), (g + t) & 1)
                v_prev = v_bufs.index(prev).reshape([BLOCK_N, D])
                if t < n_mine:
                    k = k_bufs.index(s).reshape([BLOCK_N, D]).permute((1, 0))
                    if t > 0:
                        s_f = warpgroup_mma(q, k, zero_s, use_acc=False, is_async=True)
                        acc_f = warpgroup_mma(p_op, v_prev, acc, is_async=True)
                        if PINGPONG:
                            mbarrier.arrive(turn.index((C + 1) % CONSUMERS), count=1)
                        if OVERLAP:  # (q k^T was issued first: the one product left outstanding is p v)
                            sc = warpgroup_mma_wait(num_outstanding=1, deps=(s_f,))
                            p, alpha, m_i, l_i = _softmax_tile(sc, m_i, l_i, offs_m, t * BLOCK_N, full, TQ, TK,
                                                               qk_scale, BLOCK_N, CAUSAL, SCALE_NONNEG)
                            p_nxt = gl.convert_layout(p.to(dtype), operand_layout(D))
                            # (the old p goes through the wait: its registers stay untouched until its p v is
                            # done; l and the new p too, so they are formed before it in the PTX, with which ptxas
                            # spills nothing at d = 64 (8 bytes without), though it still moves the wait up)
                            acc, p_op, l_i, p_nxt = warpgroup_mma_wait(num_outstanding=0,
                                                                       deps=(acc_f, p_op, l_i, p_nxt))
                            mbarrier.arrive(kv_empty.index(prev), count=1)
                        else:
                            sc, acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(s_f, acc_f, p_op))
                            mbarrier.arrive(kv_empty.index(prev), count=1)
                            p, alpha, m_i, l_i = _softmax_tile(sc, m_i, l_i, offs_m, t * BLOCK_N, full, TQ, TK,
                                                               qk_scale, BLOCK_N, CAUSAL, SCALE_NONNEG)
                            p_nxt = gl.convert_layout(p.to(dtype), operand_layout(D))
                    else:
                        s_f = warpgroup_mma(q, k, zero_s, use_acc=False, is_async=True)
                        if PINGPONG:
                            mbarrier.arrive(turn.index((C + 1) % CONSUMERS), count=1)
                        sc = warpgroup_mma_wait(num_outstanding=0, deps=(s_f,))
                        p, alpha, m_i, l_i = _softmax_tile(sc, m_i, l_i, offs_m, t * BLOCK_N, full, TQ, TK, qk_scale,
                                                           BLOCK_N, CAUSAL, SCALE_NONNEG)
                        p_nxt = gl.convert_layout(p.to(dtype), operand_layout(D))
                    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]  # (after the last p v)
                    p_op = p_nxt
                else:
                    if t == n_mine and t > 0:  # the last tile's p v
                        acc_f = warpgroup_mma(p_op, v_prev, acc, is_async=True)
                        if PINGPONG:
                            mbarrier.arrive(turn.index((C + 1) % CONSUMERS), count=1)
                        acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc_f, p_op))
                    elif PINGPONG:
                        mbarrier.arrive(turn.index((C + 1) % CONSUMERS), count=1)
                    if t > 0:
                        mbarrier.arrive(kv_empty.index(prev), count=1)
            mbarrier.arrive(q_empty.index(qs), count=1)
            kv += n_tiles
            g += n_tiles + 1
            _store_rows(acc, m_i, l_i, O, LSE, sob, soh, som, sod, b, h, H, r0, TQ, BLOCK_M, BLOCK_N, D)

    @gluon.jit
    def _consumer_of(q_bufs, k_bufs, v_bufs, q_bar, q_empty, kv_ready, kv_empty, turn, ones, O, LSE, sob, soh, som,
                     sod, n_m, n_bh, n_sec, H, TQ, TK, qk_scale, C: gl.constexpr, BLOCK_M: gl.constexpr,
                     BLOCK_N: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr, Q_BUFS: gl.constexpr,
                     CAUSAL: gl.constexpr, LEVELS: gl.constexpr, SCALE_NONNEG: gl.constexpr, PINGPONG: gl.constexpr,
                     OVERLAP: gl.constexpr, CONSUMERS: gl.constexpr, SUM_MMA: gl.constexpr = False):
        """The program's consumer partition C: ``_consumer_lagged`` with PINGPONG or OVERLAP, else ``_consumer``
        (which takes no turns), so one list of partitions serves every plan."""
        if PINGPONG or OVERLAP:
            _consumer_lagged(q_bufs, k_bufs, v_bufs, q_bar, q_empty, kv_ready, kv_empty, turn, O, LSE, sob, soh, som,
                             sod, n_m, n_bh, n_sec, H, TQ, TK, qk_scale, C, BLOCK_M, BLOCK_N, D, STAGES, Q_BUFS, CAUSAL,
                             LEVELS, SCALE_NONNEG, PINGPONG, OVERLAP, CONSUMERS)
        else:
            _consumer(q_bufs, k_bufs, v_bufs, q_bar, q_empty, kv_ready, kv_empty, ones, O, LSE, sob, soh, som, sod,
                      n_m, n_bh, n_sec, H, TQ, TK, qk_scale, C, BLOCK_M, BLOCK_N, D, STAGES, Q_BUFS, CAUSAL, LEVELS,
                      SCALE_NONNEG, CONSUMERS, SUM_MMA)
