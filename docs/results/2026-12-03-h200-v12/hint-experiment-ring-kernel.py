# Record of the session-16 experiment run on the H200 as scripts/_exp_hintk.py (not part of the product;
# results next to this file, see docs/perf.md, "v12").
"""Experiment kernel: the ring forward with an L2 evict-first hint on its copies and a cache modifier
on its stores."""
from kernels.methods.triton_softmax import _ring_start, _ring_wait, _ring_load
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as gl_async

_PLAIN = gl.constexpr("cp.async.cg.shared.global [$1], [$2], 16, $3; mov.u32 $0, 0;")
_HINT = gl.constexpr("{ .reg .b64 pol; createpolicy.fractional.L2::evict_first.b64 pol, 1.0; "
         "cp.async.cg.shared.global.L2::cache_hint [$1], [$2], 16, $3, pol; } mov.u32 $0, 0;")


@gluon.jit
def _ring_copy_h(dst, X, row, n_rows, n_cols, stride_xr, tv, CHUNK_I: gl.constexpr, CHUNK: gl.constexpr,
                 LOADH: gl.constexpr):
    left = gl.where(row < n_rows, n_cols - CHUNK_I * CHUNK, 0)
    src = X + gl.minimum(row, n_rows - 1).to(gl.int64) * stride_xr + CHUNK_I * CHUNK + tv
    nbytes = gl.where(tv < left, 16, 0)
    if LOADH:
        gl.inline_asm_elementwise(_HINT, "=r,r,l,r", [dst, src, nbytes], dtype=gl.int32, is_pure=False, pack=1)
    else:
        gl.inline_asm_elementwise(_PLAIN, "=r,r,l,r", [dst, src, nbytes], dtype=gl.int32, is_pure=False, pack=1)
    gl_async.commit_group()


@gluon.jit
def _fwd_ring_hint_kernel(
    X, Y, n_rows, n_vec, stride_v, scale_log2e,
    VEC: gl.constexpr, NCH: gl.constexpr, SLOTS: gl.constexpr, EVEN: gl.constexpr,
    LOADH: gl.constexpr, STOREH: gl.constexpr,
):
    """Persistent forward for rows that fit in shared memory but not in registers (16-bit, up to
    64K columns). Each program streams its rows (pid, pid + G, ...) as chunks of CHUNK columns into
    a ring of SLOTS chunk slots in shared memory (SLOTS >= NCH, the chunks of one row): pass 1 takes
    each chunk's max and rescaled sum as it lands (per thread, online), pass 2 reads the chunks
    again, writes the outputs and, as each slot empties, starts the copy of the chunk SLOTS ahead in
    the stream (the next rows'), so loads stay in flight through every row and each element is read
    from and written to global memory once. Column widths are passed in VEC-element vectors (n_vec,
    stride_v) so the compiler knows every row is 16-byte aligned.

    The copies are cp.async issued by inline PTX, each thread copying and later reading only its
    own 16 bytes of each chunk: no block barrier is needed between them (Gluon's own async copies
    would make the compiler put one before and after every chunk). The PTX addresses the ring from
    the start of the kernel's shared memory: the ring is its first allocation, the reductions'
    scratch lies after it (checked by tests/test_triton_softmax.py on the compiled kernel)."""
    W: gl.constexpr = gl.num_warps()
    T: gl.constexpr = 32 * W
    CHUNK: gl.constexpr = VEC * T
    SLOT_BYTES: gl.constexpr = 16 * T
    L2: gl.constexpr = gl.BlockedLayout([1, VEC], [32, 1], [W, 1], [1, 0])  # thread t: 16 bytes
    LT: gl.constexpr = gl.SliceLayout(1, L2)
    n_cols = n_vec * VEC
    stride_xr = stride_v * VEC
    ring, tid, tv, offs, mine = _ring_start(X, SLOTS, VEC, T, L2)
    pid = gl.program_id(0)
    G = gl.num_programs(0)
    a = gl.abs(scale_log2e)
    sgn = gl.where(scale_log2e < 0, -1.0, 1.0)  # keys x * sign(c): see _signed
    for q in gl.static_range(SLOTS):  # the first SLOTS chunks of this program's stream
        _ring_copy_h(mine + q * SLOT_BYTES, X, pid + (q // NCH) * G, n_rows, n_cols, stride_xr, tv, q % NCH, CHUNK, LOADH)
    for k in range(0, gl.cdiv(n_rows - pid, G)):
        row = pid + k * G
        base = (k * NCH) % SLOTS  # this row's first slot
        m_t = gl.full([T], -3.4028234663852886e38, gl.float32, LT)  # finite: no -inf - -inf
        s_t = gl.zeros([T], gl.float32, LT)
        for i in gl.static_range(NCH):  # pass 1; groups in flight: this row's chunks i.. and the next's
            _ring_wait(tid, SLOTS - 1 - i)
            slot, key = _ring_load(ring, base + i, SLOTS, L2)
            key = key * sgn
            if EVEN:
                m_new = gl.maximum(m_t, gl.max(key, axis=1))
                e = gl.exp2((key - m_new[:, None]) * a)
            else:
                ok = offs < n_cols - i * CHUNK
                m_new = gl.maximum(m_t, gl.max(gl.where(ok, key, float("-inf")), axis=1))
                e = gl.where(ok, gl.exp2((key - m_new[:, None]) * a), 0.0)
            s_t = s_t * gl.exp2((m_t - m_new) * a) + gl.sum(e, axis=1)
            m_t = m_new
        m = gl.max(m_t, axis=0)
        s = gl.sum(s_t * gl.exp2((m_t - m) * a), axis=0)
        inv = 1.0 / gl.where(s == 0.0, 1.0, s)  # s == 0: no finite key (all -inf): zeros; NaN stays
        y_row = Y + row.to(gl.int64) * n_cols
        for i in gl.static_range(NCH):  # pass 2: outputs, then refill the slot SLOTS chunks ahead
            slot, key = _ring_load(ring, base + i, SLOTS, L2)
            key = key * sgn
            y = (gl.exp2((key - m) * a) * inv).to(Y.dtype.element_ty)
            if EVEN:
                gl.store(y_row + i * CHUNK + offs, y, cache_modifier=STOREH)
            else:
                gl.store(y_row + i * CHUNK + offs, y, mask=offs < n_cols - i * CHUNK, cache_modifier=STOREH)
            _ring_copy_h(mine + slot * SLOT_BYTES, X, row + ((i + SLOTS) // NCH) * G, n_rows, n_cols, stride_xr,
                       tv, (i + SLOTS) % NCH, CHUNK, LOADH)
    _ring_wait(tid, 0)
