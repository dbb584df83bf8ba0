"""Column helpers of the Arrow layer."""

import pyarrow as pa

from rollout_relabel.transforms.lib.labeling.columns import list_sums


def test_list_sums_of_a_sliced_array_with_empty_and_null_lists():
    lists = pa.array([[5, 5], [1, 2, 3], [], None, [4], [7, 7, 7]], pa.list_(pa.int32())).slice(1, 4)
    assert list_sums(lists).tolist() == [6, 0, 0, 4]
    assert list_sums(pa.array([[2**31 - 1, 2**31 - 1]], pa.list_(pa.int32()))).tolist() == [2**32 - 2]  # int64 sums
