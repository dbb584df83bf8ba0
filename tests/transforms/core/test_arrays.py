"""The array backends' reductions: the run-based one for sorted ids must equal the scatter one."""
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from rollout_relabel.transforms.core.arrays import NumpyArrays

xp = NumpyArrays()

# sorted segment ids in [0, n) with empty segments anywhere (first, last, between), int or float values
sorted_segments = st.integers(1, 12).flatmap(lambda n: st.tuples(
    st.just(n),
    st.lists(st.integers(0, n - 1), max_size=40).map(sorted),
    st.sampled_from(["int64", "float64"]),
))


@given(sorted_segments, st.sampled_from(["amin", "amax"]), st.randoms(use_true_random=False))
def test_segment_sorted_equals_segment(case, reduce, rng):
    n, ids, dtype = case
    ids = np.asarray(ids, dtype=np.int64)
    values = np.asarray([rng.randint(-50, 50) for _ in ids], dtype=dtype)
    got = xp.segment_sorted(ids, n, values, reduce)
    assert got.dtype == values.dtype
    assert got.tolist() == xp.segment(ids, n, values, reduce).tolist()


def test_segment_sorted_gives_the_identity_to_empty_segments():
    ids = np.asarray([1, 1, 3], dtype=np.int64)
    values = np.asarray([5, 2, 7], dtype=np.int64)
    big, small = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    assert xp.segment_sorted(ids, 5, values, "amin").tolist() == [big, 2, big, 7, big]
    assert xp.segment_sorted(ids, 5, values, "amax").tolist() == [small, 5, small, 7, small]


# rows laid out one after another: each row's token count, empty rows anywhere
row_counts = st.lists(st.integers(0, 6), min_size=1, max_size=12)


@given(row_counts, st.integers(1, 9), st.randoms(use_true_random=False))
def test_segments_reduce_each_row_run_as_the_scatter_reductions_do(counts, size, rng):
    counts = np.asarray(counts, dtype=np.int64)
    ids = np.repeat(np.arange(len(counts)), counts)
    values = np.asarray([rng.randint(-50, 50) for _ in ids], dtype=np.float64)
    rows = xp.segments(counts)
    assert rows.sum(values).tolist() == xp.segment(ids, len(counts), values, "sum").tolist()
    assert rows.max(values).tolist() == xp.segment(ids, len(counts), values, "amax").tolist()
    assert rows.any(values > 0).tolist() == (xp.segment(ids, len(counts), (values > 0).astype(np.int64),
                                                          "sum") > 0).tolist()
    assert rows.spread(np.arange(len(counts))).tolist() == ids.tolist()
    # runs of whole rows cover every token once, in order, and reduce as the whole does
    seen, sums = [], np.zeros(len(counts))
    for tokens, row_range, part in rows.blocks(size):
        assert part.total == tokens.stop - tokens.start > 0
        assert part.total <= size or row_range.stop - row_range.start == 1 or part.total - counts[
            row_range.stop - 1] < size
        seen.extend(range(tokens.start, tokens.stop))
        sums[row_range] = part.sum(values[tokens])
    assert seen == list(range(len(ids)))
    assert sums.tolist() == rows.sum(values).tolist()
