"""The Gluon kernels of the ``triton`` softmax (Gluon: Triton's lower-level dialect, explicit layouts and
shared memory), for long 16-bit rows on a GPU: the hybrid forward (a row in registers and shared
memory) and the ring backward (rows streamed through a ring of shared-memory chunks over a pair of
programs), with their helpers and inline PTX (cp.async copies and waits, 16-bit packing). Defined only
where this Triton has Gluon; launched by ``launch``; ``plan.gluon_unusable`` says when they cannot run.
"""

from __future__ import annotations

from kernels.runtime.availability import gl, gl_async, gluon
from kernels.methods.triton.softmax.plan import _RING_MAX_WAIT

if gluon is not None:
    # cp.async.wait_group takes its count as an immediate: one asm string per count
    _RING_WAIT_ASM = gl.constexpr(tuple(f"cp.async.wait_group {n}; mov.u32 $0, 0;" for n in range(_RING_MAX_WAIT)))

    @gluon.jit
    def _ring_wait(anchor, N: gl.constexpr):
        """Wait until at most N of this thread's copy groups are in flight (no block barrier: each thread
        reads back only the bytes it copied itself)."""
        gl.inline_asm_elementwise(_RING_WAIT_ASM[N], "=r,r", [anchor], dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _ring_copy(dst, X, row, n_rows, n_cols, stride_xr, tv, CHUNK_I: gl.constexpr, CHUNK: gl.constexpr):
        """Start the copy of chunk CHUNK_I of `row` into the ring slot at shared address dst (16 bytes per
        thread, zero-filled past the row end or for rows >= n_rows), as one commit group."""
        left = gl.where(row < n_rows, n_cols - CHUNK_I * CHUNK, 0)
        src = X + gl.minimum(row, n_rows - 1).to(gl.int64) * stride_xr + CHUNK_I * CHUNK + tv
        nbytes = gl.where(tv < left, 16, 0)
        gl.inline_asm_elementwise("cp.async.cg.shared.global [$1], [$2], 16, $3; mov.u32 $0, 0;", "=r,r,l,r",
                                  [dst, src, nbytes], dtype=gl.int32, is_pure=False, pack=1)
        gl_async.commit_group()

    @gluon.jit
    def _ring_start(X, SLOTS: gl.constexpr, VEC: gl.constexpr, T: gl.constexpr, L2: gl.constexpr):
        """The ring (SLOTS chunk slots of T threads x 16 bytes, the kernel's first shared allocation), this
        thread's index in the chunk, its first column (tv), its chunk offsets and its shared address in
        slot 0 (the ring sits at the start of the kernel's shared memory; see _bwd_pair_ring_kernel)."""
        LT: gl.constexpr = gl.SliceLayout(1, L2)
        ring = gl.allocate_shared_memory(X.dtype.element_ty, [SLOTS, T, VEC], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
        tid = gl.arange(0, T, layout=LT)
        tv = tid * VEC
        offs = tv[:, None] + gl.arange(0, VEC, layout=gl.SliceLayout(0, L2))[None, :]
        mine = gl.inline_asm_elementwise("mov.u32 $0, global_smem;", "=r,r", [tid], dtype=gl.int32, is_pure=True,
                                         pack=1) + tid * 16
        return ring, tid, tv, offs, mine

    @gluon.jit
    def _ring_load(ring, pos, SLOTS: gl.constexpr, layout: gl.constexpr):
        """The ring slot of stream position pos (< 2 * SLOTS) and its chunk, fp32."""
        slot = gl.where(pos >= SLOTS, pos - SLOTS, pos)
        return slot, ring.index(slot).load(layout).to(gl.float32)

    # a word of two 16-bit elements as two fp32 values (lo, hi), and two fp32 values back as a word
    # (round to nearest even, hi in the upper half)
    _UNPACK_BF16 = gl.constexpr("shl.b32 $0, $2, 16; and.b32 $1, $2, 0xffff0000;")
    _UNPACK_F16 = gl.constexpr("{ .reg .b16 l, h; mov.b32 {l, h}, $2; cvt.f32.f16 $0, l; cvt.f32.f16 $1, h; }")
    _PACK_BF16 = gl.constexpr("cvt.rn.bf16x2.f32 $0, $2, $1;")
    _PACK_F16 = gl.constexpr("cvt.rn.f16x2.f32 $0, $2, $1;")

    @gluon.jit
    def _unpack(w, BF16: gl.constexpr):
        """(lo, hi) of the words w as fp32. Not pure: each pass converts the words again instead of the
        compiler keeping fp32 copies of the registers' part alive (twice the registers)."""
        if BF16:
            return gl.inline_asm_elementwise(_UNPACK_BF16, "=f,=f,r", [w], dtype=(gl.float32, gl.float32),
                                             is_pure=False, pack=1)
        else:
            return gl.inline_asm_elementwise(_UNPACK_F16, "=f,=f,r", [w], dtype=(gl.float32, gl.float32),
                                             is_pure=False, pack=1)

    @gluon.jit
    def _pack(lo, hi, BF16: gl.constexpr):
        if BF16:
            return gl.inline_asm_elementwise(_PACK_BF16, "=r,f,f", [lo, hi], dtype=gl.int32, is_pure=True, pack=1)
        else:
            return gl.inline_asm_elementwise(_PACK_F16, "=r,f,f", [lo, hi], dtype=gl.int32, is_pure=True, pack=1)

    @gluon.jit
    def _hybrid_keys(buf, i: gl.constexpr, z, offs, n_cols, sgn, S0: gl.constexpr, T: gl.constexpr,
                     VEC: gl.constexpr, NS: gl.constexpr, EVEN: gl.constexpr, L2: gl.constexpr):
        """Shared vector i of every thread as keys x * sign(c) in fp32, -inf past the row end (only the
        last vector, i = NS - 1, can reach past it). z: a zero the compiler cannot see through, different
        in each pass (see _fwd_hybrid_kernel)."""
        key = buf.index(i + z).load(L2).to(gl.float32) * sgn
        if not EVEN and i == NS - 1:
            key = gl.where(offs < n_cols - (S0 + i * T * VEC), key, float("-inf"))
        return key

    @gluon.jit
    def _hybrid_copy(mine, x_row, n_cols, tv, S0: gl.constexpr, T: gl.constexpr, VEC: gl.constexpr,
                     NS: gl.constexpr, EVEN: gl.constexpr, LT: gl.constexpr):
        """Start the copy of a hybrid row's shared part (columns S0 ..., NS vectors of 16 bytes per
        thread, at this thread's shared address mine + i * T * 16) as one commit group, zero-filled
        past the row end."""
        for i in gl.static_range(NS):
            c0 = S0 + i * T * VEC + tv
            if EVEN or i < NS - 1:  # (vectors before the last lie inside the row)
                src = x_row + c0
                nbytes = gl.full([T], 16, gl.int32, LT)
            else:
                src = x_row + gl.where(c0 < n_cols, c0, 0)
                nbytes = gl.where(c0 < n_cols, 16, 0)
            gl.inline_asm_elementwise("cp.async.cg.shared.global [$1], [$2], 16, $3; mov.u32 $0, 0;", "=r,r,l,r",
                                      [mine + i * T * 16, src, nbytes], dtype=gl.int32, is_pure=False, pack=1)
        gl_async.commit_group()

    @gluon.jit
    def _hybrid_words(T: gl.constexpr, NR: gl.constexpr, L3: gl.constexpr):
        """Word offsets (in the row, 32-bit words) of a hybrid row's registers' part: thread t holds
        vectors t, t + T, ... (NR of them, 4 words each); layout L3 (T x NR x 4)."""
        t3 = gl.arange(0, T, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3)))
        i3 = gl.arange(0, NR, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))
        j3 = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))
        return t3[:, None, None] * 4 + i3[None, :, None] * (T * 4) + j3[None, None, :]

    @gluon.jit(do_not_specialize=["zero"])  # (never a constant 0 the compiler could fold, whatever it specializes)
    def _fwd_hybrid_kernel(
        X, Y, XW, YW, n_vec, stride_v, scale_log2e, zero,
        NR: gl.constexpr, NS: gl.constexpr, EVEN: gl.constexpr, BF16: gl.constexpr,
    ):
        """Forward for 16-bit rows too long for one program's registers (HYBRID_MIN_N + 1 .. 64K
        columns), one program per row. Thread t keeps vectors t, t + T, ... (NR of them, 16 bytes each)
        in registers as 32-bit words (XW, YW: the same rows viewed as int32) and copies its next NS
        vectors into shared memory with cp.async, issued by inline PTX: each thread reads back only
        what it copied, so no block barrier separates the copies from the reads (Gluon's own async
        copies would put them in). The buffer is the kernel's first shared allocation, at the start of
        its shared memory, where the PTX addresses it (checked by tests/test_triton_kernels.py on the
        compiled kernel). Three passes over the on-chip row: the max of the keys x * sign(c), the sum of
        exp2((key - max) * |c|), the outputs; two block reductions. Each pass reads the shared part
        again, at slot i + k * zero in pass k (zero: a run-time 0): a compiler that saw the same slot
        read three times, and nothing writing it, could keep it in registers across passes instead.
        At most 96 KB of shared memory and 64 registers per thread (launched with maxnreg), so two
        programs share an SM and one's reductions overlap the other's memory traffic. Global memory
        is read and written once per element. Column counts come in VEC-element vectors (n_vec,
        stride_v), so the compiler knows every row is 16-byte aligned."""
        W: gl.constexpr = gl.num_warps()
        T: gl.constexpr = 32 * W
        VEC: gl.constexpr = 8
        S0: gl.constexpr = NR * T * VEC  # first column of the shared part
        L2: gl.constexpr = gl.BlockedLayout([1, VEC], [32, 1], [W, 1], [1, 0])  # thread t: one 16-byte vector
        LT: gl.constexpr = gl.SliceLayout(1, L2)
        L3: gl.constexpr = gl.BlockedLayout([1, NR, 4], [32, 1, 1], [W, 1, 1], [2, 1, 0])  # thread t: NR x 4 words
        buf, tid, tv, offs, mine = _ring_start(X, NS, VEC, T, L2)  # NS slots: this row's shared part
        row = gl.program_id(0).to(gl.int64)
        n_cols = n_vec * VEC
        x_row = X + row * (stride_v * VEC)
        _hybrid_copy(mine, x_row, n_cols, tv, S0, T, VEC, NS, EVEN, LT)
        offw = _hybrid_words(T, NR, L3)  # the registers' part (always inside the row: n_cols > S0), as words
        w = gl.load(XW + row * (stride_v * 4) + offw)
        a = gl.abs(scale_log2e)
        sgn = gl.where(scale_log2e < 0, -1.0, 1.0)  # keys x * sign(c): see _signed
        lo, hi = _unpack(w, BF16)
        m_t = gl.convert_layout(gl.max(gl.max(gl.maximum(lo * sgn, hi * sgn), axis=2), axis=1), LT)
        _ring_wait(tid, 0)
        for i in gl.static_range(NS):
            key = _hybrid_keys(buf, i, 0, offs, n_cols, sgn, S0, T, VEC, NS, EVEN, L2)
            m_t = gl.maximum(m_t, gl.max(key, axis=1))
        m = gl.max(m_t, axis=0)
        ref = gl.where(m == float("-inf"), 0.0, m)  # no finite key: every exponential below is 0
        lo, hi = _unpack(w, BF16)
        s_t = gl.convert_layout(gl.sum(gl.sum(gl.exp2((lo * sgn - ref) * a) + gl.exp2((hi * sgn - ref) * a), axis=2),
                                       axis=1), LT)
        for i in gl.static_range(NS):
            key = _hybrid_keys(buf, i, zero, offs, n_cols, sgn, S0, T, VEC, NS, EVEN, L2)
            s_t = s_t + gl.sum(gl.exp2((key - ref) * a), axis=1)
        s = gl.sum(s_t, axis=0)
        inv = 1.0 / gl.where(s == 0.0, 1.0, s)  # s == 0: no finite key (all -inf): zeros; NaN stays NaN
        lo, hi = _unpack(w, BF16)
        gl.store(YW + row * (n_vec * 4) + offw,
                 _pack(gl.exp2((lo * sgn - ref) * a) * inv, gl.exp2((hi * sgn - ref) * a) * inv, BF16))
        y_row = Y + row * n_cols + S0
        for i in gl.static_range(NS):
            key = _hybrid_keys(buf, i, 2 * zero, offs, n_cols, sgn, S0, T, VEC, NS, EVEN, L2)
            y = (gl.exp2((key - ref) * a) * inv).to(Y.dtype.element_ty)
            if EVEN or i < NS - 1:
                gl.store(y_row + i * T * VEC + offs, y)
            else:
                gl.store(y_row + i * T * VEC + offs, y, mask=offs < n_cols - (S0 + i * T * VEC))

    @gluon.jit
    def _ring_issue2(dst, Yh, DYh, row0, P, n_rows, rest, n_cols, stride_dy, tv, QN: gl.constexpr, Q: gl.constexpr,
                     CHUNK: gl.constexpr):
        """Copy stream position QN (counted from row0's first copy): item QN // Q (row row0 + that x P),
        copy QN % Q of it: y of chunk (QN % Q) // 2 when even, dy when odd."""
        if (QN % Q) % 2 == 0:
            _ring_copy(dst, Yh, row0 + (QN // Q) * P, n_rows, rest, n_cols, tv, (QN % Q) // 2, CHUNK)
        else:
            _ring_copy(dst, DYh, row0 + (QN // Q) * P, n_rows, rest, stride_dy, tv, (QN % Q) // 2, CHUNK)


    @gluon.jit
    def _bwd_pair_ring_kernel(
        Y, DY, DX, XCH, n_rows, n_vec, stride_v, scale,
        VEC: gl.constexpr, NCH: gl.constexpr, SLOTS: gl.constexpr,
    ):
        """Persistent backward for the ring path's rows: y and dy of a row (256 KB at 64K 16-bit columns)
        do not fit in one SM's shared memory, so a row is split over a pair of programs (2j: the first
        HALF = NCH x CHUNK columns, 2j + 1: the rest), each streaming its half of rows j, j + P, ... (P
        pairs) as y and dy chunks through a ring of SLOTS chunk slots in shared memory (cp.async, as the
        hybrid forward's copies; the next rows' chunks in flight while this row is reduced). Pass 1
        takes the half's sum(y * dy); the pair then trades partials through XCH (int64 per row and half, zeroed before
        the launch: bit 32 set plus the float's bits, one atomic exchange, the partner's read in a loop;
        the value travels in the atomic itself, so relaxed ordering suffices); pass 2 writes dx =
        scale * y * (dy - dot) from shared memory and refills the slots with the next rows' chunks. One
        read of y and dy and one write of dx per element. The partners must be resident at once: the
        grid is at most one program per SM, an even count (as the split path, it assumes the GPU is
        not kept full by other work that waits on this kernel)."""
        W: gl.constexpr = gl.num_warps()
        T: gl.constexpr = 32 * W
        CHUNK: gl.constexpr = VEC * T
        HALF: gl.constexpr = NCH * CHUNK
        Q: gl.constexpr = 2 * NCH  # copies per item (y and dy of each chunk)
        SLOT_BYTES: gl.constexpr = 16 * T
        L2: gl.constexpr = gl.BlockedLayout([1, VEC], [32, 1], [W, 1], [1, 0])
        LT: gl.constexpr = gl.SliceLayout(1, L2)
        n_cols = n_vec * VEC
        stride_dy = stride_v * VEC
        ring, tid, tv, offs, mine = _ring_start(Y, SLOTS, VEC, T, L2)
        pid = gl.program_id(0)
        half = pid % 2
        P = gl.num_programs(0) // 2
        first = pid // 2
        c0 = half * HALF  # this program's first column
        # this program's columns, shifted so that _ring_copy's chunk offsets count from c0
        Yh = Y + c0
        DYh = DY + c0
        rest = n_cols - c0  # columns from c0 to the row end (<= 0: none)
        for q in gl.static_range(SLOTS):  # the first SLOTS copies of this program's stream: y0, dy0, y1, dy1, ...
            _ring_issue2(mine + q * SLOT_BYTES, Yh, DYh, first, P, n_rows, rest, n_cols, stride_dy, tv, q, Q, CHUNK)
        for k in range(0, gl.cdiv(n_rows - first, P)):
            row = first + k * P
            base = (k * Q) % SLOTS
            d_t = gl.zeros([T], gl.float32, LT)
            for i in gl.static_range(NCH):  # pass 1: this half's partial of sum(y * dy)
                _ring_wait(tid, SLOTS - 2 - 2 * i)
                s0, y = _ring_load(ring, base + 2 * i, SLOTS, L2)  # y and dy of chunk i
                s1, dy = _ring_load(ring, base + 2 * i + 1, SLOTS, L2)
                d_t += gl.sum(y * dy, axis=1)
            d = gl.sum(d_t, axis=0)
            # exchange with the partner program (the other half of the row): flag bit 32 plus the float's bits
            mine_x = XCH + row.to(gl.int64) * 2 + half
            word = d.to(gl.int32, bitcast=True).to(gl.int64) & 0xFFFFFFFF
            gl.atomic_xchg(mine_x, word | (1 << 32), sem="relaxed")
            other = XCH + row.to(gl.int64) * 2 + (1 - half)
            v = gl.atomic_add(other, 0, sem="relaxed")
            while (v >> 32) == 0:
                v = gl.atomic_add(other, 0, sem="relaxed")
            dot = d + (v & 0xFFFFFFFF).to(gl.int32).to(gl.float32, bitcast=True)
            dx_row = DX + row.to(gl.int64) * n_cols + c0
            for i in gl.static_range(NCH):  # pass 2: dx, then refill both slots with chunks SLOTS ahead
                s0, y = _ring_load(ring, base + 2 * i, SLOTS, L2)  # y and dy of chunk i
                s1, dy = _ring_load(ring, base + 2 * i + 1, SLOTS, L2)
                dx = (scale * y * (dy - dot)).to(DX.dtype.element_ty)
                gl.store(dx_row + i * CHUNK + offs, dx, mask=offs < rest - i * CHUNK)
                _ring_issue2(mine + s0 * SLOT_BYTES, Yh, DYh, row, P, n_rows, rest, n_cols, stride_dy, tv, 2 * i + SLOTS, Q, CHUNK)
                _ring_issue2(mine + s1 * SLOT_BYTES, Yh, DYh, row, P, n_rows, rest, n_cols, stride_dy, tv, 2 * i + 1 + SLOTS, Q,
                             CHUNK)
        _ring_wait(tid, 0)
