"""kernels.linear_ce: the fewest chunks of one size whose logits fit the budget, and the chunk loop the
methods share."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.linear_ce import CHUNK_BYTES, chunk_rows, run_chunks


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 200_000), v=st.integers(1, 300_000), es=st.sampled_from([2, 4]),
       budget=st.sampled_from([1, 1000, 2**20, CHUNK_BYTES]))
def test_chunks_cover_the_rows_within_the_budget_and_are_fewest(n, v, es, budget):
    rows = chunk_rows(n, v, es, budget)
    chunks = -(-n // rows)
    cap = max(1, budget // (v * es))  # rows of logits that fit the budget (one at least)
    assert 1 <= rows <= n and rows <= cap  # within the budget, one row always
    assert chunks == -(-n // cap)  # no more chunks than the budget forces
    assert rows - -(-n // chunks) < 8  # even chunks: the last is not a small remainder
    assert rows % 8 == 0 or rows == n or -(-rows // 8) * 8 > cap  # whole 8-row groups where they fit


def test_a_budget_that_fits_the_rows_takes_one_chunk_and_no_rows_take_one_row():
    assert chunk_rows(3600, 50304, 2) == 3600  # 362 MB of logits fit 350 MiB: one chunk
    assert chunk_rows(0, 50304, 2) == 1


def test_the_gpt2_size_takes_five_chunks_within_half_a_gib():
    n, c, v = 16384, 768, 50304
    rows = chunk_rows(n, v, 2)
    assert (rows, -(-n // rows)) == (3280, 5)
    assert rows * v * 2 + v * c * 4 + n * c * 2 <= 0.5 * 2**30  # a chunk, the fp32 weight grad, grad_hidden


def test_the_chunk_loop_gives_every_chunk_its_rows_and_sums_both_gradients():
    """run_chunks on CPU with a stand-in row primitive (the gradient softmax - onehot, written over the
    logits) and plain float32 sums: chunks of 3 tokens over 10 cover every token once, in order, and
    grad_hidden and the weight gradient's sums equal the unchunked products; without gradients the
    primitive gets no buffer and nothing is summed."""
    g = torch.Generator().manual_seed(0)
    h, w = torch.randn(10, 4, generator=g), torch.randn(7, 4, generator=g)
    t = torch.randint(0, 7, (10,), generator=g)
    seen = []

    def rows(logits, s, e, grad):
        seen.append((s, e, grad is None))
        if grad is not None:
            grad.copy_(torch.softmax(logits, -1) - torch.nn.functional.one_hot(t[s:e], 7))

    def accumulate(acc, a, b):
        return a @ b if acc is None else acc + a @ b

    gh, gw = run_chunks(h, w, 3, rows, True, True, accumulate)
    d = torch.softmax(h @ w.T, -1) - torch.nn.functional.one_hot(t, 7)
    assert seen == [(0, 3, False), (3, 6, False), (6, 9, False), (9, 10, False)]
    assert torch.allclose(gh, d @ w, atol=1e-6) and torch.allclose(gw, d.T @ h, atol=1e-6)
    seen.clear()
    assert run_chunks(h, w, 4, rows, False, False, accumulate) == (None, None)
    assert seen == [(0, 4, True), (4, 8, True), (8, 10, True)]
