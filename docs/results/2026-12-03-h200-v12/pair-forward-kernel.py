# Record of the session-16 experiment run on the H200 as scripts/_exp_pairk.py (not part of the product;
# results next to this file, see docs/perf.md, "v12").
"""Experiment kernel: forward pair ring (a row over two programs)."""
from kernels.methods.triton_softmax import _ring_start, _ring_copy, _ring_wait, _ring_load
from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def _fwd_pair_ring_kernel(X, Y, XCH, n_rows, n_vec, stride_v, scale_log2e,
                          VEC: gl.constexpr, NCH: gl.constexpr, SLOTS: gl.constexpr):
    W: gl.constexpr = gl.num_warps()
    T: gl.constexpr = 32 * W
    CHUNK: gl.constexpr = VEC * T
    HALF: gl.constexpr = NCH * CHUNK
    SLOT_BYTES: gl.constexpr = 16 * T
    L2: gl.constexpr = gl.BlockedLayout([1, VEC], [32, 1], [W, 1], [1, 0])
    LT: gl.constexpr = gl.SliceLayout(1, L2)
    n_cols = n_vec * VEC
    stride_xr = stride_v * VEC
    ring, tid, tv, offs, mine = _ring_start(X, SLOTS, VEC, T, L2)
    pid = gl.program_id(0)
    half = pid % 2
    P = gl.num_programs(0) // 2
    first = pid // 2
    c0 = half * HALF
    Xh = X + c0
    rest = n_cols - c0
    a = gl.abs(scale_log2e)
    sgn = gl.where(scale_log2e < 0, -1.0, 1.0)
    for q in gl.static_range(SLOTS):
        _ring_copy(mine + q * SLOT_BYTES, Xh, first + (q // NCH) * P, n_rows, rest, stride_xr, tv, q % NCH, CHUNK)
    for k in range(0, gl.cdiv(n_rows - first, P)):
        row = first + k * P
        base = (k * NCH) % SLOTS
        m_t = gl.full([T], -3.4028234663852886e38, gl.float32, LT)
        s_t = gl.zeros([T], gl.float32, LT)
        for i in gl.static_range(NCH):
            _ring_wait(tid, SLOTS - 1 - i)
            slot, key = _ring_load(ring, base + i, SLOTS, L2)
            key = key * sgn
            ok = offs < rest - i * CHUNK
            m_new = gl.maximum(m_t, gl.max(gl.where(ok, key, float("-inf")), axis=1))
            e = gl.where(ok, gl.exp2((key - m_new[:, None]) * a), 0.0)
            s_t = s_t * gl.exp2((m_t - m_new) * a) + gl.sum(e, axis=1)
            m_t = m_new
        m = gl.max(m_t, axis=0)
        s = gl.sum(s_t * gl.exp2((m_t - m) * a), axis=0)
        # trade (m, s) with the partner: m's bits high, s's bits low with its sign bit as the flag (s >= 0)
        mb = m.to(gl.int32, bitcast=True).to(gl.int64)
        sb = (s.to(gl.int32, bitcast=True) | -2147483648).to(gl.int64) & 0xFFFFFFFF
        gl.atomic_xchg(XCH + row.to(gl.int64) * 2 + half, (mb << 32) | sb, sem="relaxed")
        other = XCH + row.to(gl.int64) * 2 + (1 - half)
        v = gl.atomic_add(other, 0, sem="relaxed")
        while (v & 0x80000000) == 0:
            v = gl.atomic_add(other, 0, sem="relaxed")
        om = (v >> 32).to(gl.int32).to(gl.float32, bitcast=True)
        osum = (v & 0x7FFFFFFF).to(gl.int32).to(gl.float32, bitcast=True)
        M = gl.maximum(m, om)
        S = s * gl.exp2((m - M) * a) + osum * gl.exp2((om - M) * a)
        inv = 1.0 / gl.where(S == 0.0, 1.0, S)
        y_row = Y + row.to(gl.int64) * n_cols + c0
        for i in gl.static_range(NCH):
            slot, key = _ring_load(ring, base + i, SLOTS, L2)
            key = key * sgn
            y = (gl.exp2((key - M) * a) * inv).to(Y.dtype.element_ty)
            gl.store(y_row + i * CHUNK + offs, y, mask=offs < rest - i * CHUNK)
            _ring_copy(mine + slot * SLOT_BYTES, Xh, row + ((i + SLOTS) // NCH) * P, n_rows, rest, stride_xr,
                       tv, (i + SLOTS) % NCH, CHUNK)
    _ring_wait(tid, 0)
