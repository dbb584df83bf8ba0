"""The local runner's thread count: one per core, fewer when the file groups in flight would not fit."""
import pytest

from pipeline.generate import RunSpec, write_parquet_run
from transforms.lib.inputs import expand_inputs
from pipeline.local_threads import (GROUP_MEMORY_FACTOR, MAX_LOCAL_THREADS, MEMORY_SHARE, available_memory, cores,
                                    local_thread_count)
from transforms.lib.plan import group_by_batch_sharing
from tests.conftest import run_cli

GB = 10 ** 9


@pytest.mark.parametrize("most,groups,available,shuffled,expected", [
    (4, [GB] * 6, 100 * GB, False, 4),       # plenty of memory: one thread per core
    (4, [GB] * 2, 100 * GB, False, 2),       # no more threads than groups
    (4, [], 100 * GB, True, 4),              # the shuffle path's bundles use every thread
    (4, [GB] * 6, None, False, 4),           # memory unknown: no cap
    (4, [GB] * 6, 8 * GB, False, 1),         # 2 groups in flight (5 GB) exceed half of 8 GB
    (4, [GB] * 6, 12 * GB, False, 2),        # 2 fit in 6 GB, 3 (7.5 GB) do not
    (4, [4 * GB, GB, GB, GB], 12 * GB, False, 1),  # the largest groups are the ones that could meet
    (4, [50 * GB], 1 * GB, False, 1),        # never fewer than one thread
    (2, [GB] * 3, 0, False, 1),              # no memory left: one thread
])
def test_local_thread_count(most, groups, available, shuffled, expected):
    assert local_thread_count(most, groups, available, shuffled) == expected


def test_the_cap_is_the_measured_factor_over_the_share():
    # the largest `threads` groups, times the factor, within the share of what is available
    groups = [3 * GB, 2 * GB, 2 * GB, GB]
    threads = local_thread_count(4, groups, 30 * GB)
    assert GROUP_MEMORY_FACTOR * sum(groups[:threads]) <= MEMORY_SHARE * 30 * GB
    assert GROUP_MEMORY_FACTOR * sum(groups[:threads + 1]) > MEMORY_SHARE * 30 * GB


def test_available_memory_honours_a_cgroup_limit(tmp_path):
    (tmp_path / "memory.max").write_text("1000\n")
    (tmp_path / "memory.current").write_text("400\n")
    assert available_memory(str(tmp_path)) == 600
    (tmp_path / "memory.current").write_text("5000\n")
    assert available_memory(str(tmp_path)) == 0  # over its limit already
    (tmp_path / "memory.max").write_text("max\n")
    assert available_memory(str(tmp_path)) > 10 ** 6  # no limit: the machine's available memory
    assert available_memory(str(tmp_path / "absent")) > 10 ** 6  # no cgroup v2 memory controller


def test_a_dry_run_names_the_threads_chosen(tmp_path):
    write_parquet_run(RunSpec(steps=3, prompts_per_step=2, files_per_step=1, seed=1), tmp_path / "in")
    groups, _ = group_by_batch_sharing(expand_inputs([str(tmp_path / "in")], str(tmp_path / "out")))
    threads = min(cores(), MAX_LOCAL_THREADS, len(groups))
    out = run_cli("run", "--dry-run", "--input", tmp_path / "in", "--output", tmp_path / "out").stdout
    if threads > 1:
        assert f"direct_num_workers={threads}" in out and "direct_running_mode=multi_threading" in out
    else:
        assert "direct_num_workers" not in out and "multi_threading" not in out
    one = tmp_path / "one"
    one.mkdir()
    sorted((tmp_path / "in").rglob("*.parquet"))[0].rename(one / "only.parquet")
    single = run_cli("run", "--dry-run", "--input", one, "--output", tmp_path / "out1").stdout
    assert "multi_threading" not in single  # one group: the in-memory runner, no worker threads to start
