from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp


@gluon.jit
def _ring_issue(slot_smem, X, row, n_rows, n_cols, stride_xr, offs, CHUNK_I: gl.constexpr,
                CHUNK: gl.constexpr, EVEN: gl.constexpr):
    lim = gl.where(row < n_rows, n_cols - CHUNK_I * CHUNK, 0)
    ptr = X + row.to(gl.int64) * stride_xr + CHUNK_I * CHUNK + offs
    cp.async_copy_global_to_shared(slot_smem, ptr, mask=offs < lim)
    cp.commit_group()


@gluon.jit
def fwd_ring_kernel(X, Y, n_rows, n_vec, stride_v, scale_log2e,
                    VEC: gl.constexpr, NCH: gl.constexpr, SLOTS: gl.constexpr, EVEN: gl.constexpr):
    W: gl.constexpr = gl.num_warps()
    n_cols = n_vec * VEC
    stride_xr = stride_v * VEC
    T: gl.constexpr = 32 * W
    CHUNK: gl.constexpr = VEC * T
    L2: gl.constexpr = gl.BlockedLayout([1, VEC], [32, 1], [W, 1], [1, 0])
    LT: gl.constexpr = gl.SliceLayout(1, L2)
    LV: gl.constexpr = gl.SliceLayout(0, L2)
    SH: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    ring = gl.allocate_shared_memory(X.dtype.element_ty, [SLOTS, T, VEC], SH)
    offs = gl.arange(0, T, layout=LT)[:, None] * VEC + gl.arange(0, VEC, layout=LV)[None, :]
    pid = gl.program_id(0)
    G = gl.num_programs(0)
    a = gl.abs(scale_log2e)
    sgn = gl.where(scale_log2e < 0, -1.0, 1.0)
    for q in gl.static_range(SLOTS):
        _ring_issue(ring.index(q), X, pid + (q // NCH) * G, n_rows, n_cols, stride_xr, offs, q % NCH, CHUNK, EVEN)
    n_mine = gl.cdiv(n_rows - pid, G)
    for k in range(0, n_mine):
        row = pid + k * G
        base = (k * NCH) % SLOTS
        m_t = gl.full([T], -3.4028234663852886e38, gl.float32, LT)
        s_t = gl.zeros([T], gl.float32, LT)
        for i in gl.static_range(NCH):
            cp.wait_group(SLOTS - 1 - i)
            slot = base + i
            slot = gl.where(slot >= SLOTS, slot - SLOTS, slot)
            key = ring.index(slot).load(L2).to(gl.float32) * sgn
            if EVEN:
                mc = gl.max(key, axis=1)
            else:
                ok = offs < n_cols - i * CHUNK
                mc = gl.max(gl.where(ok, key, float("-inf")), axis=1)
            m_new = gl.maximum(m_t, mc)
            e = gl.exp2((key - m_new[:, None]) * a)
            if not EVEN:
                e = gl.where(ok, e, 0.0)
            s_t = s_t * gl.exp2((m_t - m_new) * a) + gl.sum(e, axis=1)
            m_t = m_new
        M = gl.max(m_t, axis=0)
        S = gl.sum(s_t * gl.exp2((m_t - M) * a), axis=0)
        inv = 1.0 / gl.where(S == 0.0, 1.0, S)
        y_row = Y + row.to(gl.int64) * n_cols
        for i in gl.static_range(NCH):
            slot = base + i
            slot = gl.where(slot >= SLOTS, slot - SLOTS, slot)
            key = ring.index(slot).load(L2).to(gl.float32) * sgn
            y = (gl.exp2((key - M) * a) * inv).to(Y.dtype.element_ty)
            if EVEN:
                gl.store(y_row + i * CHUNK + offs, y)
            else:
                gl.store(y_row + i * CHUNK + offs, y, mask=offs < n_cols - i * CHUNK)
            _ring_issue(ring.index(slot), X, row + ((i + SLOTS) // NCH) * G, n_rows, n_cols, stride_xr, offs,
                        (i + SLOTS) % NCH, CHUNK, EVEN)
    cp.wait_group(0)


WAIT_ASM = gl.constexpr(tuple(f"cp.async.wait_group {n}; mov.u32 $0, 0;" for n in range(64)))


@gluon.jit
def _asm_wait(dummy, N: gl.constexpr):
    gl.inline_asm_elementwise(WAIT_ASM[N], "=r,r", [dummy], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _smem_base(dummy):
    """Shared address of the kernel's dynamic shared memory (the ring is its first allocation)."""
    return gl.inline_asm_elementwise("mov.u32 $0, global_smem;", "=r,r", [dummy], dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def _asm_issue(smem_addr, X, row, n_rows, n_cols, stride_xr, tv, CHUNK_I: gl.constexpr, CHUNK: gl.constexpr,
               VEC: gl.constexpr):
    lim = gl.where(row < n_rows, n_cols - CHUNK_I * CHUNK, 0)
    ptr = X + row.to(gl.int64) * stride_xr + CHUNK_I * CHUNK + tv
    nbytes = gl.where(tv < lim, 16, 0)
    gl.inline_asm_elementwise("cp.async.cg.shared.global [$1], [$2], 16, $3; mov.u32 $0, 0;", "=r,r,l,r",
                              [smem_addr, ptr, nbytes], dtype=gl.int32, is_pure=False, pack=1)
    cp.commit_group()


@gluon.jit
def fwd_ring_asm_kernel(X, Y, n_rows, n_vec, stride_v, scale_log2e,
                        VEC: gl.constexpr, NCH: gl.constexpr, SLOTS: gl.constexpr, EVEN: gl.constexpr):
    W: gl.constexpr = gl.num_warps()
    n_cols = n_vec * VEC
    stride_xr = stride_v * VEC
    T: gl.constexpr = 32 * W
    CHUNK: gl.constexpr = VEC * T
    L2: gl.constexpr = gl.BlockedLayout([1, VEC], [32, 1], [W, 1], [1, 0])
    LT: gl.constexpr = gl.SliceLayout(1, L2)
    LV: gl.constexpr = gl.SliceLayout(0, L2)
    SH: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    ring = gl.allocate_shared_memory(X.dtype.element_ty, [SLOTS, T, VEC], SH)
    tid = gl.arange(0, T, layout=LT)
    tv = tid * VEC
    offs = tv[:, None] + gl.arange(0, VEC, layout=LV)[None, :]
    my_smem = _smem_base(tid) + tid * 16  # this thread's 16 bytes of slot 0
    SLOT_BYTES: gl.constexpr = CHUNK * 16 // VEC
    pid = gl.program_id(0)
    G = gl.num_programs(0)
    a = gl.abs(scale_log2e)
    sgn = gl.where(scale_log2e < 0, -1.0, 1.0)
    for q in gl.static_range(SLOTS):
        _asm_issue(my_smem + q * SLOT_BYTES, X, pid + (q // NCH) * G, n_rows, n_cols, stride_xr, tv, q % NCH, CHUNK, VEC)
    n_mine = gl.cdiv(n_rows - pid, G)
    for k in range(0, n_mine):
        row = pid + k * G
        base = (k * NCH) % SLOTS
        m_t = gl.full([T], -3.4028234663852886e38, gl.float32, LT)
        s_t = gl.zeros([T], gl.float32, LT)
        for i in gl.static_range(NCH):
            _asm_wait(tid, SLOTS - 1 - i)
            slot = base + i
            slot = gl.where(slot >= SLOTS, slot - SLOTS, slot)
            key = ring.index(slot).load(L2).to(gl.float32) * sgn
            if EVEN:
                mc = gl.max(key, axis=1)
            else:
                ok = offs < n_cols - i * CHUNK
                mc = gl.max(gl.where(ok, key, float("-inf")), axis=1)
            m_new = gl.maximum(m_t, mc)
            e = gl.exp2((key - m_new[:, None]) * a)
            if not EVEN:
                e = gl.where(ok, e, 0.0)
            s_t = s_t * gl.exp2((m_t - m_new) * a) + gl.sum(e, axis=1)
            m_t = m_new
        M = gl.max(m_t, axis=0)
        S = gl.sum(s_t * gl.exp2((m_t - M) * a), axis=0)
        inv = 1.0 / gl.where(S == 0.0, 1.0, S)
        y_row = Y + row.to(gl.int64) * n_cols
        for i in gl.static_range(NCH):
            slot = base + i
            slot = gl.where(slot >= SLOTS, slot - SLOTS, slot)
            key = ring.index(slot).load(L2).to(gl.float32) * sgn
            y = (gl.exp2((key - M) * a) * inv).to(Y.dtype.element_ty)
            if EVEN:
                gl.store(y_row + i * CHUNK + offs, y)
            else:
                gl.store(y_row + i * CHUNK + offs, y, mask=offs < n_cols - i * CHUNK)
            _asm_issue(my_smem + slot * SLOT_BYTES, X, row + ((i + SLOTS) // NCH) * G, n_rows, n_cols, stride_xr, tv,
                       (i + SLOTS) % NCH, CHUNK, VEC)
    cp.wait_group(0)
