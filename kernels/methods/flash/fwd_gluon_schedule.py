"""The Gluon forward's work-tile schedule (``fwd_gluon``): which work tiles a program takes and in what
order, shared by its producer and consumers. A work tile is CONSUMERS x BLOCK_M queries of one (batch, head);
a program takes one, or (persistent) one a round of the programs (``_tile_of``)."""

from __future__ import annotations

from kernels.methods.flash.gluon_common import gl, gluon

_tile_count = _tile_of = _work_tile = None  # (defined below where Gluon is)

if gluon is not None:

    @gluon.jit
    def _tile_count(total):
        """How many of `total` work tiles this program takes: the programs take them in rounds of one each,
        the last round partial (see ``_tile_of``)."""
        pid = gl.program_id(0)
        n_prog = gl.num_programs(0)
        full = total // n_prog
        rem = total % n_prog
        if full % 2 == 0:
            last = pid < rem
        else:
            last = pid >= n_prog - rem
        return full + last.to(gl.int32)

    @gluon.jit
    def _tile_of(it):
        """This program's it-th work tile: round it's, the programs in order on even rounds and in reverse on
        odd ones (a snake, so a program that took a heavier tile in one round takes a lighter one in the
        next); a program a tile (num_programs = tiles): its own."""
        pid = gl.program_id(0)
        n_prog = gl.num_programs(0)
        if it % 2 == 0:
            t = it * n_prog + pid
        else:
            t = it * n_prog + n_prog - 1 - pid
        return t

    @gluon.jit
    def _work_tile(t, n_m, n_bh, n_sec, H, TQ, TK, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
                   LEVELS: gl.constexpr, CONSUMERS: gl.constexpr):
        """The forward's work tile t of n_m query blocks (CONSUMERS x BLOCK_M queries) x n_bh (batch, head) pairs:
        (b, h, its first query m0, the key tiles up to its last visible key). Head by head, each head's blocks
        heaviest first when causal (a grid of one tile a program starts them in this order); LEVELS
        (persistent programs, causal): the heads in sections of n_sec (the last one may be smaller), and in a
        section every head's heaviest block, then every head's next, ..., so a round of the programs' tiles is
        of few weights (the programs' loads stay even) while the keys and values they read are a section's
        (FA3's L2 swizzle: sized to stay in L2, they are read from memory about once; n_sec = n_bh: every
        head in one section).

        Causal with three consumers, the blocks end at Tq rather than start at 0 (m0 may be negative: TMA
        reads those rows as zeros, and their consumers find no key and store nothing): Tq is rarely a multiple
        of 192, and the partial block, where one or two consumers idle, is then the lightest, not the heaviest
        (at Tq = 1024: 27 key-tile steps a head instead of 32)."""
        if LEVELS:
            sec = t // (n_sec * n_m)
            j = t - sec * (n_sec * n_m)
            heads = gl.minimum(n_sec, n_bh - sec * n_sec)
            bh = sec * n_sec + j % heads
            blk = n_m - 1 - j // heads
        else:
            bh = t // n_m
            blk = t % n_m
            if CAUSAL:
                blk = n_m - 1 - blk
        if CAUSAL and CONSUMERS == 3:
            m0 = TQ - (n_m - blk) * (CONSUMERS * BLOCK_M)
        else:
            m0 = blk * (CONSUMERS * BLOCK_M)
        if CAUSAL:
            hi = gl.maximum(gl.minimum(m0 + CONSUMERS * BLOCK_M + TK - TQ, TK), 0)
        else:
            hi = TK
        return bh // H, bh % H, m0, (hi + BLOCK_N - 1) // BLOCK_N
