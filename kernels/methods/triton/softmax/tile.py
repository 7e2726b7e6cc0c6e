"""The ``@triton.jit`` kernels of the ``triton`` softmax: the tile path (and its fill variant for causal
forward rows), the persistent tile path, the split path and the long (streaming) path, forward and
backward, with their helpers. Defined only where Triton imports; launched by ``launch``; the paths are
described in the package docstring (``kernels/methods/triton/softmax/__init__.py``).
"""

from __future__ import annotations

from kernels.runtime.availability import tl, triton

if triton is not None:

    @triton.jit
    def _row_limit(rows, n_cols, tq, diag, CAUSAL: tl.constexpr):
        """Number of unmasked keys of each row (query i = row mod Tq keeps keys j <= i + diag); rows: a
        tensor of rows, or one row (a scalar, whose limit without CAUSAL is n_cols itself)."""
        if CAUSAL:  # (one assignment per branch, not two returns: a causal int64 row gives an int64 limit)
            lim = tl.minimum(tl.maximum((rows % tq) + diag + 1, 0), n_cols)
        else:
            lim = tl.zeros(rows.shape, tl.int32) + n_cols
        return lim

    @triton.jit
    def _vector_limit(lim, n_cols, CAUSAL: tl.constexpr, ROUND_MASK: tl.constexpr):
        """With ROUND_MASK, causal prefixes rounded up to a multiple of 8 columns, so that masked loads
        stay whole 16-byte vectors (a ragged mask forces element-wise loads); the exact mask is applied
        after. Without it, the loads stop at the exact prefix."""
        if CAUSAL and ROUND_MASK:
            return tl.minimum(((lim + 7) // 8) * 8, n_cols)
        return lim

    @triton.jit
    def _tile_masks(n_rows, n_cols, tq, diag, BLOCK_N: tl.constexpr, ROWS: tl.constexpr, CAUSAL: tl.constexpr,
                    ROUND_MASK: tl.constexpr):
        """The tile kernels' prologue: this program's ROWS rows (int64, for addressing), the columns, which
        rows exist (row_ok) and which elements are unmasked keys (keep) and are loaded (ld: see
        _vector_limit). (The store mask stays in the kernels, next to the store: computed here, its
        compares move ahead of the loads and the causal kernels' SASS changes.)"""
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK_N)
        row_ok = rows < n_rows
        lim = _row_limit(rows, n_cols, tq, diag, CAUSAL)
        keep = row_ok[:, None] & (cols[None, :] < lim[:, None])
        rows64 = rows.to(tl.int64)
        ld = row_ok[:, None] & (cols[None, :] < _vector_limit(lim, n_cols, CAUSAL, ROUND_MASK)[:, None])
        return rows64, cols, row_ok, keep, ld

    @triton.jit
    def _signed(x, scale_log2e):
        """x * sign(c): x * c = (x * sign(c)) * |c|, so the row's max is taken on the scores themselves
        (exact) and each exponent is (x - max) * |c|: exactly 0 at the max, whatever the magnitude.
        (exp2(fma(x, c, -round(max * c))) shifts every exponent by the max's rounding error, up to
        |max * c| / 2^25: exp2 overflows past |max * c| ~ 2^32.)"""
        return tl.where(scale_log2e < 0, -x, x)

    @triton.jit
    def _rescaled(s, m, ref, a):
        """Sums s taken relative to maxima m, brought to the reference ref (m = -inf: an empty part,
        which adds 0 even when the scale is 0)."""
        return tl.where(m == float("-inf"), 0.0, s * tl.exp2((m - ref) * a))

    @triton.jit
    def _fwd_tile_kernel(
        X, Y, n_rows, n_cols, stride_xr, stride_xc, tq, diag, scale_log2e,
        BLOCK_N: tl.constexpr, ROWS: tl.constexpr, CAUSAL: tl.constexpr, ROUND_MASK: tl.constexpr,
    ):
        rows64, cols, row_ok, keep, ld = _tile_masks(n_rows, n_cols, tq, diag, BLOCK_N, ROWS, CAUSAL, ROUND_MASK)
        x = tl.load(X + rows64[:, None] * stride_xr + cols[None, :] * stride_xc, mask=ld, other=0.0)
        x = _signed(x.to(tl.float32), scale_log2e)
        a = tl.abs(scale_log2e)
        m = tl.max(tl.where(keep, x, float("-inf")), axis=1)  # mask after the sign
        m = tl.where(m == float("-inf"), 0.0, m)  # rows with no unmasked key
        e = tl.where(keep, tl.exp2((x - m[:, None]) * a), 0.0)
        s = tl.sum(e, axis=1)
        inv = 1.0 / tl.where(s == 0.0, 1.0, s)  # s == 0 only for rows with no unmasked key; NaN stays
        y = e * inv[:, None]
        out_ok = row_ok[:, None] & (cols[None, :] < n_cols)
        tl.store(Y + rows64[:, None] * n_cols + cols[None, :], y.to(Y.dtype.element_ty), mask=out_ok)

    @triton.jit
    def _fwd_fill_kernel(
        X, Y, n_rows, n_cols, stride_xr, stride_xc, tq, diag, c, fill,
        BLOCK_N: tl.constexpr, ROWS: tl.constexpr, CAUSAL: tl.constexpr,
    ):
        """The tile kernel with masked columns read as a fill instead of masked element by element (the
        path of causal forward rows): fill = -inf for c > 0, +inf for c < 0 (c = scale * log2(e),
        finite and nonzero; else the tile kernel), so the row's reference r (the max of x, the min for
        c < 0), the exponentials exp2((x - r) * c) (exactly 0 at the fill), the sum and the stores need
        no mask. Loads are whole vectors up to the prefix rounded up (_vector_limit); the columns
        of the vector that straddles the prefix's end get the fill after the load. Per element
        that leaves a convert, a select, a min/max, the exponential and the normalisation: about 30%
        fewer instructions than the tile kernel, which masks, signs and predicates every element."""
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK_N)[None, :]
        row_ok = rows < n_rows
        lim = tl.where(row_ok, _row_limit(rows, n_cols, tq, diag, CAUSAL), 0)
        rows64 = rows.to(tl.int64)
        ld = cols < _vector_limit(lim, n_cols, CAUSAL, True)[:, None]
        x = tl.load(X + rows64[:, None] * stride_xr + cols * stride_xc, mask=ld, other=fill)
        x = tl.where(cols < lim[:, None], x.to(tl.float32), fill)
        if c > 0:
            r = tl.max(x, axis=1)
        else:
            r = tl.min(x, axis=1)
        r = tl.where(r == fill, 0.0, r)[:, None]  # no key above -inf (after the sign): every exponential is 0
        e = tl.exp2((x - r) * c)
        s = tl.sum(e, axis=1)
        inv = 1.0 / tl.where(s == 0.0, 1.0, s)  # NaN stays NaN
        tl.store(Y + rows64[:, None] * n_cols + cols, (e * inv[:, None]).to(Y.dtype.element_ty),
                 mask=row_ok[:, None] & (cols < n_cols))

    @triton.jit
    def _fwd_persist_kernel(
        X, Y, n_rows, n_cols, stride_xr, stride_xc, tq, diag, scale_log2e,
        BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, STAGES: tl.constexpr,
    ):
        """Persistent tile path, one row at a time: the loop over rows is software-pipelined by Triton
        (STAGES - 1 rows prefetched into shared memory with cp.async while this one is reduced), so an
        SM that holds a single long row still keeps loads in flight."""
        cols = tl.arange(0, BLOCK_N)
        a = tl.abs(scale_log2e)
        for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0), num_stages=STAGES):
            r = tl.cast(row, tl.int64)
            lim = _row_limit(r, n_cols, tq, diag, CAUSAL)
            keep = cols < lim
            x = tl.load(X + r * stride_xr + cols * stride_xc, mask=keep, other=0.0).to(tl.float32)
            x = _signed(x, scale_log2e)
            m = tl.max(tl.where(keep, x, float("-inf")), axis=0)
            m = tl.where(m == float("-inf"), 0.0, m)
            e = tl.where(keep, tl.exp2((x - m) * a), 0.0)
            s = tl.sum(e, axis=0)
            inv = 1.0 / tl.where(s == 0.0, 1.0, s)
            tl.store(Y + r * n_cols + cols, (e * inv).to(Y.dtype.element_ty), mask=cols < n_cols)

    @triton.jit
    def _widen_again(v, opaque_zero):
        """v (as loaded) in fp32 once more, by a conversion the compiler cannot merge with the one before: a
        16-bit v is xor-ed with opaque_zero (0 at run time, unknown to the compiler) first, so its second
        widening is of another value and v itself, not its fp32 copy, stays live in between."""
        if v.dtype.primitive_bitwidth == 16:
            v = (v.to(tl.int16, bitcast=True) ^ opaque_zero.to(tl.int16)).to(v.dtype, bitcast=True)
        return v.to(tl.float32)

    @triton.jit
    def _bwd_persist_kernel(
        Y, DY, DX, n_rows, n_cols, stride_dyr, stride_dyc, tq, diag, scale,
        BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, STAGES: tl.constexpr, NARROW: tl.constexpr = False,
    ):
        """NARROW: as the tile kernel's (y and dy held as loaded, widened again for dx): at 32768 columns on
        32 warps the widened row spills 40 bytes a thread (Triton 3.6), the narrow one does not."""
        cols = tl.arange(0, BLOCK_N)
        for row in tl.range(tl.program_id(0), n_rows, tl.num_programs(0), num_stages=STAGES):
            r = tl.cast(row, tl.int64)
            lim = _row_limit(r, n_cols, tq, diag, CAUSAL)
            keep = cols < lim
            y_in = tl.load(Y + r * n_cols + cols, mask=keep, other=0.0)
            dy_in = tl.load(DY + r * stride_dyr + cols * stride_dyc, mask=keep, other=0.0)
            y, dy = y_in.to(tl.float32), dy_in.to(tl.float32)
            dot = tl.sum(y * dy, axis=0)
            if NARROW:
                zero = n_cols >> 31  # (n_cols > 0)
                y, dy = _widen_again(y_in, zero), _widen_again(dy_in, zero)
            dx = tl.where(keep, scale * y * (dy - dot), 0.0)
            tl.store(DX + r * n_cols + cols, dx.to(DX.dtype.element_ty), mask=cols < n_cols)

    @triton.jit
    def _fwd_long_kernel(
        X, Y, n_cols, stride_xr, stride_xc, tq, diag, scale_log2e,
        BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        lim = _row_limit(row, n_cols, tq, diag, CAUSAL)
        x_row = X + row * stride_xr
        y_row = Y + row * n_cols
        cols = tl.arange(0, BLOCK_N)
        a = tl.abs(scale_log2e)
        # the running max per lane starts at the lowest finite float, not -inf, so that (m_vec - m_new)
        # * |c| stays finite (no -inf * 0 = NaN at scale 0) without a select per element; a row with
        # no finite unmasked score keeps it, and its -inf scores still give exp2(-inf) = 0
        m_vec = tl.full([BLOCK_N], -3.4028234663852886e38, tl.float32)
        s_vec = tl.zeros([BLOCK_N], tl.float32)
        for start in range(0, lim, BLOCK_N):  # pass 1: online max and rescaled sum, per lane
            c = start + cols
            keep = c < lim
            x = tl.load(x_row + c * stride_xc, mask=keep, other=0.0, eviction_policy="evict_last")
            x = _signed(x.to(tl.float32), scale_log2e)
            m_new = tl.maximum(m_vec, tl.where(keep, x, float("-inf")))
            s_vec = s_vec * tl.exp2((m_vec - m_new) * a) + tl.where(keep, tl.exp2((x - m_new) * a), 0.0)
            m_vec = m_new
        m = tl.max(m_vec, axis=0)
        s = tl.sum(s_vec * tl.exp2((m_vec - m) * a), axis=0)
        inv = 1.0 / tl.where(s == 0.0, 1.0, s)
        n_chunks = tl.cdiv(n_cols, BLOCK_N)
        for k in range(0, n_chunks):  # pass 2, backwards: the chunks read last are still cached
            c = (n_chunks - 1 - k) * BLOCK_N + cols
            keep = c < lim
            x = tl.load(x_row + c * stride_xc, mask=keep, other=0.0, eviction_policy="evict_first")
            x = _signed(x.to(tl.float32), scale_log2e)
            y = tl.where(keep, tl.exp2((x - m) * a) * inv, 0.0)
            tl.store(y_row + c, y.to(Y.dtype.element_ty), mask=c < n_cols)

    @triton.jit
    def _split_chunk(CNT, splits, n_cols, tq, diag, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                     PHASE: tl.constexpr):
        """This program's row, chunk, the chunk's columns and which of them are unmasked. PHASE 0 (one
        launch, GPU): the chunk from the ticket counter CNT[0], so chunks start in ticket order (see
        the module docstring); else from the program id."""
        if PHASE == 0:
            vid = tl.atomic_add(CNT, 1)
        else:
            vid = tl.program_id(0)
        row = (vid // splits).to(tl.int64)
        part = vid % splits
        cols = part * BLOCK_N + tl.arange(0, BLOCK_N)
        return row, part, cols, cols < _row_limit(row, n_cols, tq, diag, CAUSAL)

    @triton.jit
    def _split_arrive_and_wait(CNT_ROW, splits):
        """Count this program's partial as published (release) and wait until every chunk of the row
        has (acquire). The barrier first: all of this program's partial stores precede the release."""
        tl.debug_barrier()
        tl.atomic_add(CNT_ROW, 1, sem="release")
        while tl.atomic_add(CNT_ROW, 0, sem="acquire") < splits:
            pass

    @triton.jit
    def _fwd_split_kernel(
        X, Y, CNT, STAT, n_cols, splits, stride_xr, stride_xc, tq, diag, scale_log2e,
        BLOCK_N: tl.constexpr, SPLITS_P2: tl.constexpr, CAUSAL: tl.constexpr, PHASE: tl.constexpr,
    ):
        """PHASE 0: whole kernel (GPU). PHASE 1: partials only; PHASE 2: outputs only (interpreter)."""
        row, part, cols, keep = _split_chunk(CNT, splits, n_cols, tq, diag, BLOCK_N, CAUSAL, PHASE)
        x = tl.load(X + row * stride_xr + cols * stride_xc, mask=keep, other=0.0).to(tl.float32)
        x = _signed(x, scale_log2e)
        a = tl.abs(scale_log2e)
        m = tl.max(tl.where(keep, x, float("-inf")), axis=0)
        ref = tl.where(m == float("-inf"), 0.0, m)
        e = tl.where(keep, tl.exp2((x - ref) * a), 0.0)
        s = tl.sum(e, axis=0)
        stat_m = STAT + row * (2 * splits)  # this row's partials: splits maxima, then splits sums
        if PHASE != 2:
            tl.store(stat_m + part, m)
            tl.store(stat_m + splits + part, s)
        if PHASE == 0:
            _split_arrive_and_wait(CNT + 1 + row, splits)
        if PHASE != 1:
            p = tl.arange(0, SPLITS_P2)
            ms = tl.load(stat_m + p, mask=p < splits, other=float("-inf"), cache_modifier=".cg")
            ss = tl.load(stat_m + splits + p, mask=p < splits, other=0.0, cache_modifier=".cg")
            big_m = tl.max(ms, axis=0)
            big_ref = tl.where(big_m == float("-inf"), 0.0, big_m)
            big_s = tl.sum(_rescaled(ss, ms, big_ref, a), axis=0)  # -inf maxima (empty chunks) add 0
            # a chunk with nothing unmasked took ref = 0, above the row's reference when every kept key
            # is negative: its exponent, clamped at 0, keeps f finite (its outputs are 0, not 0 x inf);
            # any other chunk's ref is at most big_ref, unchanged. NaN stays NaN (through big_s).
            f = tl.exp2(tl.minimum((ref - big_ref) * a, 0.0)) / tl.where(big_s == 0.0, 1.0, big_s)
            tl.store(Y + row * n_cols + cols, (e * f).to(Y.dtype.element_ty), mask=cols < n_cols)

    @triton.jit
    def _bwd_split_kernel(
        Y, DY, DX, CNT, STAT, n_cols, splits, stride_dyr, stride_dyc, tq, diag, scale,
        BLOCK_N: tl.constexpr, SPLITS_P2: tl.constexpr, CAUSAL: tl.constexpr, PHASE: tl.constexpr,
    ):
        row, part, cols, keep = _split_chunk(CNT, splits, n_cols, tq, diag, BLOCK_N, CAUSAL, PHASE)
        y = tl.load(Y + row * n_cols + cols, mask=keep, other=0.0).to(tl.float32)
        dy = tl.load(DY + row * stride_dyr + cols * stride_dyc, mask=keep, other=0.0).to(tl.float32)
        stat = STAT + row * splits
        if PHASE != 2:
            tl.store(stat + part, tl.sum(y * dy, axis=0))
        if PHASE == 0:
            _split_arrive_and_wait(CNT + 1 + row, splits)
        if PHASE != 1:
            p = tl.arange(0, SPLITS_P2)
            dot = tl.sum(tl.load(stat + p, mask=p < splits, other=0.0, cache_modifier=".cg"), axis=0)
            dx = tl.where(keep, scale * y * (dy - dot), 0.0)
            tl.store(DX + row * n_cols + cols, dx.to(DX.dtype.element_ty), mask=cols < n_cols)

    @triton.jit
    def _bwd_whole_rows(Y, DY, DX, n_cols, stride_dyr, stride_dyc, scale, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
                        NARROW: tl.constexpr):
        """``_bwd_tile_kernel`` where every row is BLOCK_N unmasked columns: the same products, no mask."""
        rows64 = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
        cols = tl.arange(0, BLOCK_N)
        y_in = tl.load(Y + rows64[:, None] * BLOCK_N + cols[None, :])
        dy_in = tl.load(DY + rows64[:, None] * stride_dyr + cols[None, :] * stride_dyc)
        y, dy = y_in.to(tl.float32), dy_in.to(tl.float32)
        dot = tl.sum(y * dy, axis=1)
        if NARROW:
            zero = n_cols >> 31  # (n_cols > 0)
            y, dy = _widen_again(y_in, zero), _widen_again(dy_in, zero)
        dx = scale * y * (dy - dot[:, None])
        tl.store(DX + rows64[:, None] * BLOCK_N + cols[None, :], dx.to(DX.dtype.element_ty))

    @triton.jit
    def _bwd_tile_kernel(
        Y, DY, DX, n_rows, n_cols, stride_dyr, stride_dyc, tq, diag, scale,
        BLOCK_N: tl.constexpr, ROWS: tl.constexpr, CAUSAL: tl.constexpr, ROUND_MASK: tl.constexpr,
        RELOAD: tl.constexpr = False, NARROW: tl.constexpr = False, WHOLE: tl.constexpr = False,
    ):
        """WHOLE (not with RELOAD): every row of every program is BLOCK_N unmasked columns (not causal,
        n_cols = BLOCK_N, ROWS dividing n_rows), so no masks at all: a third fewer instructions (at 32768 on 32
        warps, narrow: 456 against 672), +0.4-0.6% at 32768 on an H100 (measured, docs/perf.md).
        RELOAD: y and dy are read twice, for the dot and again (from L1) for dx, so the widened row is not
        held in registers across the row's reduction (at 16384 columns on 16 warps: 44 registers a thread
        against 87, two programs per SM instead of one). The second loads carry another cache modifier,
        which keeps the compiler from merging them with the first. NARROW: y and dy are held as loaded
        (16-bit: half the registers) and widened again for dx (``_widen_again``): 51 registers at 16384 on 16
        warps, 32 at 8192 and 60 without a spill at 32768 on 32 warps, Liger's kernel's occupancy with fp32
        math (the result is the held row's, bit for bit)."""
        if WHOLE:
            _bwd_whole_rows(Y, DY, DX, n_cols, stride_dyr, stride_dyc, scale, BLOCK_N, ROWS, NARROW)
            return
        rows64, cols, row_ok, keep, ld = _tile_masks(n_rows, n_cols, tq, diag, BLOCK_N, ROWS, CAUSAL, ROUND_MASK)
        y_at = Y + rows64[:, None] * n_cols + cols[None, :]
        dy_at = DY + rows64[:, None] * stride_dyr + cols[None, :] * stride_dyc
        y_in = tl.load(y_at, mask=ld, other=0.0)
        y = tl.where(keep, y_in.to(tl.float32), 0.0)
        dy_in = tl.load(dy_at, mask=ld, other=0.0)
        dy = tl.where(keep, dy_in.to(tl.float32), 0.0)  # (this order: the held path's SASS as before NARROW)
        dot = tl.sum(y * dy, axis=1)
        if RELOAD:
            y = tl.where(keep, tl.load(y_at, mask=ld, other=0.0, cache_modifier=".ca").to(tl.float32), 0.0)
            dy = tl.where(keep, tl.load(dy_at, mask=ld, other=0.0, cache_modifier=".ca").to(tl.float32), 0.0)
        if NARROW:
            zero = n_cols >> 31  # (n_cols > 0)
            y = tl.where(keep, _widen_again(y_in, zero), 0.0)
            dy = tl.where(keep, _widen_again(dy_in, zero), 0.0)
        dx = tl.where(keep, scale * y * (dy - dot[:, None]), 0.0)  # y, dy past lim are not masked-out zeros
        out_ok = row_ok[:, None] & (cols[None, :] < n_cols)
        tl.store(DX + rows64[:, None] * n_cols + cols[None, :], dx.to(DX.dtype.element_ty), mask=out_ok)

    @triton.jit
    def _bwd_long_kernel(
        Y, DY, DX, n_cols, stride_dyr, stride_dyc, tq, diag, scale,
        BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        lim = _row_limit(row, n_cols, tq, diag, CAUSAL)
        y_row = Y + row * n_cols
        dy_row = DY + row * stride_dyr
        dx_row = DX + row * n_cols
        cols = tl.arange(0, BLOCK_N)
        acc = tl.zeros([BLOCK_N], tl.float32)
        for start in range(0, lim, BLOCK_N):  # pass 1: sum(dy * y)
            c = start + cols
            keep = c < lim
            y = tl.load(y_row + c, mask=keep, other=0.0, eviction_policy="evict_last")
            dy = tl.load(dy_row + c * stride_dyc, mask=keep, other=0.0, eviction_policy="evict_last")
            acc += y.to(tl.float32) * dy.to(tl.float32)
        dot = tl.sum(acc, axis=0)
        n_chunks = tl.cdiv(n_cols, BLOCK_N)
        for k in range(0, n_chunks):  # pass 2, backwards (cache-friendly, as in the forward)
            c = (n_chunks - 1 - k) * BLOCK_N + cols
            keep = c < lim
            y = tl.load(y_row + c, mask=keep, other=0.0, eviction_policy="evict_first").to(tl.float32)
            dy = tl.load(dy_row + c * stride_dyc, mask=keep, other=0.0, eviction_policy="evict_first")
            dx = tl.where(keep, scale * y * (dy.to(tl.float32) - dot), 0.0)
            tl.store(dx_row + c, dx.to(DX.dtype.element_ty), mask=c < n_cols)
