"""Shared pieces of the flash kernels: tile loads and stores (pointers or tensor descriptors), the
causal loop bounds, and the host side of TMA (which tensors qualify, descriptors, the allocator).

Every tensor is addressed as (B, H, T, d) with its own four strides, so the model's (B, T, H, d)
views transposed to (B, H, T, d) are read in place. Pointer tiles mask rows past T and columns past
the head dimension (padded to a power of two); descriptor tiles get both from TMA, which fills
out-of-bounds elements with zeros on a load and drops them on a store.
"""

from __future__ import annotations

from typing import Optional

import torch

from kernels.runtime.availability import TRITON_ERROR, interpreter_enabled, tl, triton  # noqa: F401

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except Exception:  # pragma: no cover - Triton before 3.4
    TensorDescriptor = None

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
#: TMA codes of the kernels' TMA constexpr (plan.TMA_MODES in order).
TMA_CODE = {"off": 0, "host": 1, "device": 2}


def empty_bthd(B: int, H: int, T: int, D: int, dtype: torch.dtype, device) -> torch.Tensor:
    """An uninitialized (B, H, T, D) tensor laid out as (B, T, H, D) in memory: the layout the model's
    q/k/v views come from, so the output and the gradients flow back through its transposes, views and
    concatenation without a copy."""
    return torch.empty_strided((B, H, T, D), (T * H * D, D, H * D, 1), dtype=dtype, device=device)


def empty_grad(t: torch.Tensor) -> torch.Tensor:
    """The gradient of an input (q, k or v): in the input's own strides where it is dense (a leaf's .grad
    then takes the kernels' tensor as is: autograd copies a gradient whose strides differ from its dense
    leaf's, three copies of B H T d elements a backward for contiguous (B, H, T, d) inputs); else (a view
    of a projection, the model's) laid out as (B, T, H, D) like ``empty_bthd``."""
    if t.is_contiguous():  # (the usual dense input, without the walk below)
        return torch.empty_like(t)
    packed = 1  # dense: the strides, sizes-1 dimensions aside, in some order 1, n0, n0 n1, ...
    for stride, size in sorted((s, n) for s, n in zip(t.stride(), t.shape) if n != 1):
        if stride != packed:
            break
        packed *= size
    else:
        return torch.empty_like(t)  # (preserve_format: a dense tensor's strides)
    B, H, T, D = t.shape
    return empty_bthd(B, H, T, D, t.dtype, t.device)


def tma_supported(device: torch.device) -> bool:
    """TMA exists on sm_90+ GPUs (and in Triton's interpreter, which emulates descriptors)."""
    if TensorDescriptor is None:
        return False
    if device.type != "cuda":
        return interpreter_enabled()
    return _capability(device.index if device.index is not None else torch.cuda.current_device()) >= 9


_CAPS: dict[int, int] = {}


def _capability(index: int) -> int:
    cap = _CAPS.get(index)
    if cap is None:
        cap = _CAPS[index] = torch.cuda.get_device_capability(index)[0]
    return cap


def kv_group(n_head: int, n_kv_head: int) -> int:
    """Query heads a kv head (grouped-query attention: query head h reads kv head h // group), refusing a number
    of kv heads that does not divide the query heads'."""
    if n_kv_head < 1 or n_head % n_kv_head:
        raise ValueError(f"flash attention takes k and v with a number of heads dividing q's (grouped-query "
                         f"attention); got {n_head} query heads and {n_kv_head} kv heads")
    return n_head // n_kv_head


def tma_eligible(*tensors: torch.Tensor) -> bool:
    """TMA reads a tensor when its base is 16-byte aligned, its last stride is 1 and every other
    stride is a positive multiple of 16 bytes (a broadcast stride 0 or an odd row pitch: pointers)."""
    for t in tensors:
        if t.stride(-1) != 1 or t.data_ptr() % 16:
            return False
        es = t.element_size()
        for s in t.stride()[:-1]:
            if s <= 0 or (s * es) % 16:
                return False
    return True


def host_descriptor(t: torch.Tensor, block_rows: int, d_pad: int):
    """A rank-4 descriptor of a (B, H, T, d) tensor whose box is one (head, batch)'s tile of
    block_rows x d_pad (the kernels reshape the (1, 1, rows, d) box to (rows, d))."""
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, block_rows, d_pad])


def _scratch(size: int, alignment: int, stream: Optional[int]) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda" if torch.cuda.is_available() else "cpu")


def ensure_allocator() -> None:
    """Device-built descriptors live in global scratch memory that Triton asks an allocator for.
    Triton keeps the allocator in a context variable, which a thread does not inherit (autograd runs
    the backward on its own threads), so this is set before each such launch (one ContextVar.set)."""
    triton.set_allocator(_scratch)


if triton is not None:

    @triton.jit
    def load_rows(X, b, h, row0, n_rows, s_b, s_h, s_r, s_c,
                  BLOCK: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
                  TMA: tl.constexpr, ROW_MASK: tl.constexpr):
        """Rows row0 .. row0 + BLOCK of (batch b, head h): a (BLOCK, D_PAD) tile, zeros past n_rows
        (when ROW_MASK; a pointer load without it must be in bounds) and past D."""
        if TMA:
            x = X.load([b, h, row0, 0]).reshape([BLOCK, D_PAD])
        else:
            rows = row0 + tl.arange(0, BLOCK)
            cols = tl.arange(0, D_PAD)
            ptrs = X + b.to(tl.int64) * s_b + h.to(tl.int64) * s_h + rows[:, None] * s_r + cols[None, :] * s_c
            if ROW_MASK:
                if D == D_PAD:
                    x = tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)
                else:
                    x = tl.load(ptrs, mask=(rows[:, None] < n_rows) & (cols[None, :] < D), other=0.0)
            else:
                if D == D_PAD:
                    x = tl.load(ptrs)
                else:
                    x = tl.load(ptrs, mask=cols[None, :] < D, other=0.0)
        return x

    @triton.jit
    def store_rows(X, x, b, h, row0, n_rows, s_b, s_h, s_r, s_c,
                   BLOCK: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr, TMA: tl.constexpr):
        """Store a (BLOCK, D_PAD) tile at rows row0 .. of (b, h); rows past n_rows and columns past D
        are dropped."""
        if TMA:
            X.store([b, h, row0, 0], x.reshape([1, 1, BLOCK, D_PAD]))
        else:
            rows = row0 + tl.arange(0, BLOCK)
            cols = tl.arange(0, D_PAD)
            ptrs = X + b.to(tl.int64) * s_b + h.to(tl.int64) * s_h + rows[:, None] * s_r + cols[None, :] * s_c
            if D == D_PAD:
                tl.store(ptrs, x, mask=rows[:, None] < n_rows)
            else:
                tl.store(ptrs, x, mask=(rows[:, None] < n_rows) & (cols[None, :] < D))

    @triton.jit
    def mma(a, b, acc, PREC: tl.constexpr):
        """a @ b (+ acc) in fp32. PREC 0: tensor cores (16-bit inputs); 1: full-precision fp32 dots
        (tf32 would miss the fp32 tolerance); 2: 16-bit tiles widened to fp32 first, for Triton's
        interpreter, which multiplies bfloat16 tiles as the integers it stores them in (exact: a
        product of two 16-bit floats is exact in fp32)."""
        if PREC == 0:
            c = tl.dot(a, b, acc)
        elif PREC == 1:
            c = tl.dot(a, b, acc, input_precision="ieee")
        else:
            c = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        return c

    if interpreter_enabled():  # (decided at import, as the kernels' PREC: the interpreter has no libdevice)
        @triton.jit
        def fast_log2(x):
            """log2 of fp32 x >= 1 (a row's sum l), in Triton's interpreter the precise one."""
            return tl.math.log2(x)
    else:
        from triton.language.extra import libdevice

        @triton.jit
        def fast_log2(x):
            """log2 of fp32 x >= 1 (a row's sum l) by the SFU's lg2.approx (one MUFU.LG2, absolute error below
            2^-21 there), where tl.math.log2 is libdevice's precise log2f: ~25 instructions a value, in the
            epilogue of every forward program."""
            return libdevice.fast_log2f(x)

    @triton.jit
    def device_descriptor(X, B, H, T, s_b, s_h, s_r, BLOCK: tl.constexpr, D: tl.constexpr,
                          D_PAD: tl.constexpr):
        """The device-built twin of host_descriptor (TMA mode "device")."""
        return tl.make_tensor_descriptor(X, shape=[B, H, T, D], strides=[s_b, s_h, s_r, 1],
                                         block_shape=[1, 1, BLOCK, D_PAD])

    @triton.jit
    def key_bounds(m0, TQ, TK, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
        """For the queries m0 .. m0 + BLOCK_M: keys [0, full) need no mask (every one visible to
        every query of the block, and inside Tk), keys [full, hi) need the causal / boundary mask,
        keys from hi on are invisible to all of them (skipped). Query i sees key j <= i + Tk - Tq."""
        if CAUSAL:
            off = TK - TQ
            hi = tl.maximum(tl.minimum(m0 + BLOCK_M + off, TK), 0)
            full = tl.maximum(tl.minimum(m0 + off + 1, TK), 0) // BLOCK_N * BLOCK_N
        else:
            hi = TK
            full = TK // BLOCK_N * BLOCK_N
        return full, hi

    @triton.jit
    def query_bounds(n0, TQ, TK, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
        """For the keys n0 .. n0 + BLOCK_N: queries [lo, full) need the causal mask, [full, Tq) see
        every key of the block, queries before lo see none (skipped)."""
        if CAUSAL:
            off = TK - TQ
            lo = tl.maximum(n0 - off, 0) // BLOCK_M * BLOCK_M
            diag_end = tl.minimum(tl.maximum(n0 + BLOCK_N - off, 0), TQ)  # queries >= this see all
            full = lo + tl.cdiv(tl.maximum(diag_end - lo, 0), BLOCK_M) * BLOCK_M
            full = tl.minimum(full, TQ)
        else:
            lo = 0
            full = 0
        return lo, full
