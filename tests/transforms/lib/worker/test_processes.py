"""The pool of worker processes: a .pt dump read there is the table read in the thread, bad files included."""
import os

import pytest
import torch

from rollout_relabel.transforms.lib.errors import BadFile
from rollout_relabel.transforms.lib.io.readers import read_table
from rollout_relabel.transforms.lib.worker import processes
from tests.conftest import FIXTURES


@pytest.fixture(scope="module", autouse=True)
def stopped_after():
    yield
    processes.shutdown()


@pytest.mark.parametrize("folder", ["slime_rollout_data", "miles_rollout_data", "miles_reward_dict"])
def test_a_dump_read_on_the_pool_is_the_one_read_in_the_thread(folder):
    path = os.path.join(FIXTURES, folder, "0.pt")
    here, here_metadata = read_table(path)
    there, there_metadata = read_table(path, processes=2)
    assert there.equals(here) and there.schema.metadata == here.schema.metadata
    assert there_metadata == here_metadata


class CallsGetcwd:
    def __reduce__(self):
        return os.getcwd, ()


def test_a_bad_file_travels_back_as_its_reason(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"rollout_id": 0, "samples": [{"reward": 1.0, "x": CallsGetcwd()}]}, path)
    with pytest.raises(BadFile) as caught:
        read_table(str(path), processes=2)
    assert caught.value.reason == "unsafe-pickle" and str(path) in caught.value.message
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(BadFile) as caught:
        read_table(str(tmp_path / "empty.pt"), processes=2)
    assert caught.value.reason == "empty-file"


def test_the_pool_is_made_once_and_replaced_for_another_size():
    first = processes.pool(2)
    assert processes.pool(2) is first
    assert processes.run(2, divmod, 7, 2) == (3, 1)
    assert processes.pool(1) is not first
    assert processes.run(1, divmod, 9, 4) == (2, 1)
