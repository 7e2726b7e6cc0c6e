# Record of the session-17 experiment run on the H200 as scripts/_exp_thyb_k.py (not part of the product;
# results next to this file, see docs/perf.md, "v13").
"""Experiment (session 17): a Gluon hybrid forward for 16-bit rows of 32769-65536 columns: one program
per row (grid = rows), NR 16-byte vectors per thread held in registers as packed 32-bit words, the rest
of the row (NS vectors per thread) copied into shared memory with cp.async (each thread reads back only
its own), so two programs fit an SM and one's reductions overlap the other's loads and stores."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from kernels.methods.triton_softmax import _ring_wait

# (lo, hi) of a word of two 16-bit elements as fp32, and back (round to nearest even); not pure, so each
# pass converts again instead of keeping fp32 copies of the register part alive
UNPACK_BF16 = gl.constexpr("shl.b32 $0, $2, 16; and.b32 $1, $2, 0xffff0000;")
UNPACK_F16 = gl.constexpr("{ .reg .b16 l, h; mov.b32 {l, h}, $2; cvt.f32.f16 $0, l; cvt.f32.f16 $1, h; }")
PACK_BF16 = gl.constexpr("cvt.rn.bf16x2.f32 $0, $2, $1;")
PACK_F16 = gl.constexpr("cvt.rn.f16x2.f32 $0, $2, $1;")


@gluon.jit
def _unpack(w, UNPACK: gl.constexpr):
    return gl.inline_asm_elementwise(UNPACK, "=f,=f,r", [w], dtype=(gl.float32, gl.float32), is_pure=False, pack=1)


@gluon.jit
def _fwd_hybrid_kernel(X, Y, XW, YW, n_vec, stride_v, scale_log2e, NR: gl.constexpr, NS: gl.constexpr,
                       EVEN: gl.constexpr, UNPACK: gl.constexpr, PACK: gl.constexpr):
    W: gl.constexpr = gl.num_warps()
    T: gl.constexpr = 32 * W
    VEC: gl.constexpr = 8
    L2: gl.constexpr = gl.BlockedLayout([1, VEC], [32, 1], [W, 1], [1, 0])  # thread t: one 16-byte vector
    LT: gl.constexpr = gl.SliceLayout(1, L2)
    L3: gl.constexpr = gl.BlockedLayout([1, NR, 4], [32, 1, 1], [W, 1, 1], [2, 1, 0])  # thread t: its NR vectors
    LR: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, L3))
    buf = gl.allocate_shared_memory(X.dtype.element_ty, [NS, T, VEC], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    row = gl.program_id(0).to(gl.int64)
    n_cols = n_vec * VEC
    stride = stride_v * VEC
    tid = gl.arange(0, T, layout=LT)
    tv = tid * VEC
    mine = gl.inline_asm_elementwise("mov.u32 $0, global_smem;", "=r,r", [tid], dtype=gl.int32, is_pure=True,
                                     pack=1) + tid * 16
    S0: gl.constexpr = NR * T * VEC  # first column of the shared part
    for i in gl.static_range(NS):  # the shared part: cp.async, one commit group
        c0 = S0 + i * T * VEC + tv
        if EVEN:
            src = X + row * stride + c0
            nbytes = gl.full([T], 16, gl.int32, LT)
        else:
            src = X + row * stride + gl.where(c0 < n_cols, c0, 0)
            nbytes = gl.where(c0 < n_cols, 16, 0)
        gl.inline_asm_elementwise("cp.async.cg.shared.global [$1], [$2], 16, $3; mov.u32 $0, 0;", "=r,r,l,r",
                                  [mine + i * T * 16, src, nbytes], dtype=gl.int32, is_pure=False, pack=1)
    gl.inline_asm_elementwise("cp.async.commit_group; mov.u32 $0, 0;", "=r,r", [tid], dtype=gl.int32,
                              is_pure=False, pack=1)
    # the register part: words (two elements each) of vectors t, t + T, ... (always inside the row)
    t3 = gl.arange(0, T, layout=LR)
    i3 = gl.arange(0, NR, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))
    j3 = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))
    offw = t3[:, None, None] * 4 + i3[None, :, None] * (T * 4) + j3[None, None, :]
    w = gl.load(XW + row * (stride_v * 4) + offw)
    a = gl.abs(scale_log2e)
    sgn = gl.where(scale_log2e < 0, -1.0, 1.0)  # keys x * sign(c)
    lo, hi = _unpack(w, UNPACK)
    m_r = gl.max(gl.max(gl.maximum(lo * sgn, hi * sgn), axis=2), axis=1)
    m_t = gl.convert_layout(m_r, LT)
    _ring_wait(tid, 0)
    offs = tv[:, None] + gl.arange(0, VEC, layout=gl.SliceLayout(0, L2))[None, :]
    for i in gl.static_range(NS):
        key = buf.index(i).load(L2).to(gl.float32) * sgn
        if not EVEN:
            key = gl.where(offs < n_cols - (S0 + i * T * VEC), key, float("-inf"))
        m_t = gl.maximum(m_t, gl.max(key, axis=1))
    m = gl.max(m_t, axis=0)
    ref = gl.where(m == float("-inf"), 0.0, m)
    lo, hi = _unpack(w, UNPACK)
    s_r = gl.sum(gl.sum(gl.exp2((lo * sgn - ref) * a) + gl.exp2((hi * sgn - ref) * a), axis=2), axis=1)
    s_t = gl.convert_layout(s_r, LT)
    for i in gl.static_range(NS):
        key = buf.index(i).load(L2).to(gl.float32) * sgn
        if not EVEN:
            key = gl.where(offs < n_cols - (S0 + i * T * VEC), key, float("-inf"))
        s_t = s_t + gl.sum(gl.exp2((key - ref) * a), axis=1)
    s = gl.sum(s_t, axis=0)
    inv = 1.0 / gl.where(s == 0.0, 1.0, s)  # s == 0: no finite key (all -inf): zeros; NaN stays NaN
    lo, hi = _unpack(w, UNPACK)
    ylo = gl.exp2((lo * sgn - ref) * a) * inv
    yhi = gl.exp2((hi * sgn - ref) * a) * inv
    yw = gl.inline_asm_elementwise(PACK, "=r,f,f", [ylo, yhi], dtype=gl.int32, is_pure=True, pack=1)
    gl.store(YW + row * (n_vec * 4) + offw, yw)
    y_row = Y + row * n_cols + S0
    for i in gl.static_range(NS):
        key = buf.index(i).load(L2).to(gl.float32) * sgn
        y = (gl.exp2((key - ref) * a) * inv).to(Y.dtype.element_ty)
        if EVEN:
            gl.store(y_row + i * T * VEC + offs, y)
        else:
            gl.store(y_row + i * T * VEC + offs, y, mask=offs < n_cols - (S0 + i * T * VEC))
