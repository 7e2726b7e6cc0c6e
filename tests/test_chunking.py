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
    assert 1 <= rows <= n
    assert rows * v * es <= max(budget, v * es)  # one row always fits, whatever the budget
    cap = max(1, budget // (v * es))
    if cap >= 64:
        cap -= cap % 64
    assert chunks == -(-n // min(cap, n))  # no more chunks than the budget forces
    assert rows - (n - (chunks - 1) * rows) < 8 * chunks  # the last chunk is not a small remainder


def test_the_gpt2_size_takes_five_chunks_within_half_a_gib():
    n, c, v = 16384, 768, 50304
    rows = chunk_rows(n, v, 2)
    assert (rows, -(-n // rows)) == (3280, 5)
    assert rows * v * 2 + v * c * 4 + n * c * 2 <= 0.5 * 2**30  # a chunk, the fp32 weight grad, grad_hidden
