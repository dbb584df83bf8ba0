"""The skyrl format's reader on batches built from SkyRL's documented fields (tests/skyrl_batches.py): the rows,
their keys and SkyRL's advantage, and every way a file can be bad, each a BadFile naming the file."""
import io
import os
import pickle
import sys

import numpy as np
import pytest

from rollout_relabel.transforms.core.reasons import Reason
from rollout_relabel.transforms.lib.errors import BadFile
from rollout_relabel.transforms.lib.io import formats
from rollout_relabel.transforms.lib.io.formats import skyrl_format
from tests.skyrl_batches import MODULE, Rollout, TrainingInputBatch, batch_state, serialise, skyrl_names, write_batch

GROUPS = [
    [Rollout([1, 2], [3, 4, 5], [1, 1, 1], [0.5] * 3),
     Rollout([1, 2], [6, 7], [0, 1], [0.7, -0.5])],   # its first trainable token is its second
    [Rollout([9], [8, 7, 6, 5], [1, 0, 1, 1], [0.25, 0.2, 0.3, 0.4])],
    [Rollout([4, 4, 4], [2], [0], [1.5])],             # no trainable token: its first response token's
]


def read(path):
    return skyrl_format.read_batch(str(path), None)


def test_rows_keys_and_skyrls_advantage(tmp_path):
    path = write_batch(tmp_path, 7, batch_state(GROUPS, pad_size=2))
    table, metadata = read(path)
    rows = table.to_pylist()
    assert metadata == {"step": 7, "prompt_group_sizes": None}
    assert [r["row_index"] for r in rows] == [0, 1, 2, 3, 4, 5]
    assert [r["global_step"] for r in rows] == [7] * 6
    assert [r["group_index"] for r in rows] == [0, 0, 1, 2, 3, 4]  # padding rows: groups of their own
    assert [r["rollout_id"] for r in rows] == [0, 1, 2, 3, 4, 5]
    assert [r["not_trained"] for r in rows] == [None] * 4 + ["padding row (pad_size 2)"] * 2
    assert [r["skyrl_advantage"] for r in rows] == [0.5, -0.5, 0.25, 1.5, 0.5, 0.5]
    assert [r["tokens"] for r in rows] == [[1, 2, 3, 4, 5], [1, 2, 6, 7], [9, 8, 7, 6, 5], [4, 4, 4, 2],
                                           [1, 2, 3, 4, 5], [1, 2, 3, 4, 5]]
    assert [r["response_length"] for r in rows] == [3, 2, 4, 1, 3, 3]
    assert [r["loss_mask"] for r in rows] == [[1, 1, 1], [0, 1], [1, 0, 1, 1], [0], [0, 0, 0], [0, 0, 0]]
    assert str(table.schema.field("loss_mask").type) == "list<item: int8>"
    assert rows[1]["advantages"] == pytest.approx([0.7, -0.5])
    assert rows[2]["rollout_log_probs"] == [-0.5] * 4
    # bfloat16 (a torch.save blob inside the pickle) comes back as float32: -0.52 rounds to -0.51953125
    assert rows[0]["base_action_log_probs"] == [-0.51953125] * 3
    assert "values" not in table.column_names  # None in the batch (no critic)


def test_the_pickle_names_only_skyrls_globals(tmp_path):
    """The fixture writes the globals SkyRL's writer writes, and nothing else is needed to read it."""
    import pickletools

    data = open(write_batch(tmp_path, 1, batch_state(GROUPS)), "rb").read()
    strings = [arg for op, arg, _ in pickletools.genops(data) if isinstance(arg, str)]
    assert {MODULE, "_rebuild_tensor_batch", "TrainingInputBatch", "torch", "device"} <= set(strings)
    assert read(tmp_path / "dumped_data" / "global_step_1_training_input.pkl")[0].num_rows == 4


def test_detection_and_the_registry_path(tmp_path):
    assert formats.detect("out/dumped_data/global_step_12_training_input.pkl").name == "skyrl"
    assert formats.detect("global_step_3_training_input.pkl").name == "skyrl"
    assert formats.detect("out/dumped_data/global_step_12_training_output.pkl") is None
    assert skyrl_format.step_from_name("x/dumped_data/global_step_12_training_input.pkl") == 12
    path = write_batch(tmp_path, 12, batch_state(GROUPS, pad_size=1))
    table, metadata = formats.read_table(path)  # on a worker process, as a run reads it
    assert metadata["step"] == 12 and table.column("step").to_pylist() == [12] * 5
    assert table.column("not_trained").null_count == 4


def test_step_wise_trajectories_and_uids_when_the_metadata_keeps_them(tmp_path):
    state = batch_state(GROUPS, metadata_extra={"is_last_step": [False, True, True, True]})
    del state["metadata"]["policy_prompt_boundaries"]
    state["metadata"]["uids"] = ["b", "b", "a", "c"]
    table, _ = read(write_batch(tmp_path, 1, state))
    assert table.column("rollout_id").to_pylist() == [0, 0, 1, 2]
    assert table.column("group_index").to_pylist() == [0, 0, 1, 2]


def expect_bad(path, reason, *words):
    with pytest.raises(BadFile) as caught:
        read(path)
    assert caught.value.reason == reason, caught.value.message
    assert str(path) in caught.value.message
    for word in words:
        assert word in caught.value.message
    return caught.value.message


def test_empty_and_truncated_files(tmp_path):
    path = write_batch(tmp_path, 1, batch_state(GROUPS))
    data = open(path, "rb").read()
    empty = tmp_path / "global_step_2_training_input.pkl"
    empty.write_bytes(b"")
    expect_bad(empty, Reason.EMPTY_FILE)
    for cut in (len(data) // 2, len(data) - 1, 5):
        truncated = tmp_path / f"global_step_{cut}_training_input.pkl"
        truncated.write_bytes(data[:cut])
        expect_bad(truncated, Reason.UNREADABLE_FILE, "corrupt or truncated")


class Runs:
    def __reduce__(self):
        return (os.system, ("touch " + self.target,))


def test_an_unknown_global_is_refused_and_never_called(tmp_path):
    hostile = Runs()
    hostile.target = str(tmp_path / "ran")
    path = tmp_path / "global_step_1_training_input.pkl"
    path.write_bytes(pickle.dumps(hostile))
    expect_bad(path, Reason.UNSAFE_PICKLE, "system", "not one of SkyRL's batch names")
    assert not (tmp_path / "ran").exists()
    # a global inside the state (not only at the top) is refused the same way
    state = batch_state(GROUPS)
    state["metadata"]["hook"] = hostile
    expect_bad(write_batch(tmp_path / "inner", 1, state), Reason.UNSAFE_PICKLE, "system")
    assert not (tmp_path / "ran").exists()


def test_another_class_of_skyrls_module_is_refused(tmp_path):
    class TrainingOutputBatch(TrainingInputBatch):
        pass

    TrainingOutputBatch.__module__ = MODULE
    TrainingOutputBatch.__qualname__ = "TrainingOutputBatch"
    path = tmp_path / "global_step_1_training_input.pkl"
    with skyrl_names():

        sys.modules[MODULE].TrainingOutputBatch = TrainingOutputBatch
        path.write_bytes(pickle.dumps(TrainingOutputBatch(batch_state(GROUPS))))
    expect_bad(path, Reason.UNSAFE_PICKLE, "TrainingOutputBatch")


def test_a_batch_pickled_before_rebuild_tensor_batch_is_refused(tmp_path):
    """SkyRL before its #1379: the batch a dict subclass, its tensors pickled by torch as well."""
    class TrainingInputBatch(dict):
        def __getstate__(self):
            return self.state

    TrainingInputBatch.__module__, TrainingInputBatch.__qualname__ = MODULE, "TrainingInputBatch"
    import torch

    old = TrainingInputBatch({"sequences": torch.zeros(2, 3, dtype=torch.int64)})
    old.state = batch_state(GROUPS)
    path = tmp_path / "global_step_1_training_input.pkl"
    with skyrl_names():
        sys.modules[MODULE].TrainingInputBatch = TrainingInputBatch
        path.write_bytes(pickle.dumps(old))
    expect_bad(path, Reason.UNSAFE_PICKLE, "before SkyRL's #1379")


def test_build_on_an_admitted_name_is_refused():
    """BUILD (setstate) on what find_class hands out would write into it for every later load."""
    stream = io.BytesIO()
    stream.write(b"\x80\x04\x8c" + bytes([len(MODULE)]) + MODULE.encode() + b"\x8c\x12TrainingInputBatch\x93}b.")
    with pytest.raises(pickle.UnpicklingError, match="BUILD on the batch class"):
        skyrl_format.load_batch(stream.getvalue())


def test_not_a_batch(tmp_path):
    path = tmp_path / "global_step_1_training_input.pkl"
    path.write_bytes(pickle.dumps({"batch_dict": {}}))
    expect_bad(path, Reason.UNREADABLE_FILE, "not a SkyRL TrainingInputBatch")


def test_inconsistent_shapes(tmp_path):
    state = batch_state(GROUPS)
    advantages = np.zeros((3, 4), np.float32)  # one row fewer than the batch
    state["batch_dict"]["advantages"] = serialise(advantages)
    expect_bad(write_batch(tmp_path, 1, state), Reason.UNREADABLE_FILE, "inconsistent shapes", "advantages")


def test_bytes_that_do_not_fill_the_shape(tmp_path):
    state = batch_state(GROUPS)
    state["batch_dict"]["loss_mask"]["data"] = state["batch_dict"]["loss_mask"]["data"][:-4]
    expect_bad(write_batch(tmp_path, 1, state), Reason.UNREADABLE_FILE, "loss_mask", "truncated or inconsistent")


def test_a_dtype_that_is_not_numeric(tmp_path):
    state = batch_state(GROUPS)
    state["batch_dict"]["sequences"]["dtype"] = "object"
    expect_bad(write_batch(tmp_path, 1, state), Reason.ILL_TYPED_COLUMN, "sequences", "'object'")


def test_a_missing_tensor(tmp_path):
    state = batch_state(GROUPS)
    state["batch_dict"]["advantages"] = None
    expect_bad(write_batch(tmp_path, 1, state), Reason.MISSING_COLUMN, "advantages")


def test_boundaries_that_do_not_tile_the_rows(tmp_path):
    state = batch_state(GROUPS, pad_size=1)
    state["metadata"]["policy_prompt_boundaries"] = [(0, 2), (3, 4)]
    expect_bad(write_batch(tmp_path, 1, state), Reason.GROUP_SIZES_MISMATCH, "policy_prompt_boundaries[1]")
    state["metadata"]["policy_prompt_boundaries"] = [(0, 2), (2, 3)]
    expect_bad(write_batch(tmp_path, 2, state), Reason.GROUP_SIZES_MISMATCH, "end at row 3")
    del state["metadata"]["policy_prompt_boundaries"]
    expect_bad(write_batch(tmp_path, 3, state), Reason.MISSING_COLUMN, "policy_prompt_boundaries")


def test_a_pad_size_beyond_the_batch(tmp_path):
    state = batch_state(GROUPS)
    state["metadata"]["pad_size"] = 9
    expect_bad(write_batch(tmp_path, 1, state), Reason.UNREADABLE_FILE, "pad_size")


def test_a_torch_blob_holding_no_tensor(tmp_path):
    import torch

    state = batch_state(GROUPS)
    buffer = io.BytesIO()
    torch.save({"not": "a tensor"}, buffer)
    state["batch_dict"]["returns"] = {"format": "torch", "data": buffer.getvalue()}
    expect_bad(write_batch(tmp_path, 1, state), Reason.UNREADABLE_FILE, "returns", "not a tensor")
    state["batch_dict"]["returns"] = {"format": "torch", "data": b"PK\x03\x04 truncated"}
    expect_bad(write_batch(tmp_path, 2, state), Reason.UNREADABLE_FILE, "returns")


def test_a_file_ends_whole_at_its_stop_opcode(tmp_path):
    data = open(write_batch(tmp_path, 1, batch_state(GROUPS)), "rb").read()
    assert skyrl_format.ends_whole(io.BytesIO(data), len(data))
    assert not skyrl_format.ends_whole(io.BytesIO(data), len(data) - 1)  # the head of a file still being written
