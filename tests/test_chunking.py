"""kernels.chunking: the fewest chunks of one size whose logits fit the budget."""

from hypothesis import given, settings
from hypothesis import strategies as st

from kernels.chunking import CHUNK_BYTES, chunk_rows


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
