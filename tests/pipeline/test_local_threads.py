"""The local runner's thread count: one per core, fewer when the file groups in flight would not fit."""
import pytest

from rollout_relabel.pipeline.generate import RunSpec, write_parquet_run
from rollout_relabel.pipeline.local_threads import available_memory, create_reshuffles, local_thread_count
from rollout_relabel.pipeline.parse import parse
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
    # the largest `threads` groups, times 2.5 (the measured factor), within half of what is available:
    # 2 threads hold 2.5 x (3 + 2) = 12.5 GB <= 15 GB; 3 would hold 2.5 x 7 = 17.5 GB > 15 GB
    groups = [3 * GB, 2 * GB, 2 * GB, GB]
    assert local_thread_count(4, groups, 30 * GB) == 2
    assert local_thread_count(4, groups, 25 * GB) == 2       # 12.5 GB is exactly half: still fits
    assert local_thread_count(4, groups, 25 * GB - 1) == 1   # a byte less and it does not
    assert local_thread_count(4, groups, 35 * GB) == 3       # 17.5 GB is exactly half of 35


def test_available_memory_honours_a_cgroup_limit(tmp_path):
    (tmp_path / "memory.max").write_text("1000\n")
    (tmp_path / "memory.current").write_text("400\n")
    assert available_memory(str(tmp_path)) == 600
    (tmp_path / "memory.current").write_text("5000\n")
    assert available_memory(str(tmp_path)) == 0  # over its limit already
    (tmp_path / "memory.max").write_text("max\n")
    assert available_memory(str(tmp_path)) > 10 ** 6  # no limit: the machine's available memory
    assert available_memory(str(tmp_path / "absent")) > 10 ** 6  # no cgroup v2 memory controller


def test_a_dry_run_names_the_threads_chosen(tmp_path, monkeypatch):
    import rollout_relabel.pipeline.local_threads as local_threads
    import rollout_relabel.pipeline.output_parquet as run  # the folder run: threads, memory, its graph

    write_parquet_run(RunSpec(steps=3, prompts_per_step=2, files_per_step=1, seed=1), tmp_path / "in")
    monkeypatch.setattr(run, "available_memory", lambda: 100 * GB)
    monkeypatch.setattr(local_threads, "cores", lambda: 8)  # at most 4 threads, and 3 file groups: 3
    out = run_cli("run", "--dry-run", "--input", tmp_path / "in", "--output", tmp_path / "out").stdout
    assert "direct_num_workers=3" in out and "direct_running_mode=multi_threading" in out
    monkeypatch.setattr(local_threads, "cores", lambda: 1)  # one core: the plain in-memory runner
    out = run_cli("run", "--dry-run", "--input", tmp_path / "in", "--output", tmp_path / "out").stdout
    assert "direct_num_workers" not in out and "multi_threading" not in out
    one = tmp_path / "one"
    one.mkdir()
    sorted((tmp_path / "in").rglob("*.parquet"))[0].rename(one / "only.parquet")
    single = run_cli("run", "--dry-run", "--input", one, "--output", tmp_path / "out1").stdout
    assert "multi_threading" not in single  # one group: the in-memory runner, no worker threads to start


def test_pyarrow_decodes_in_parallel_only_where_workers_leave_cores_idle(monkeypatch):
    import rollout_relabel.pipeline.local_threads as local_threads

    monkeypatch.setattr(local_threads, "cores", lambda: 2)
    assert local_threads.parallel_decode(1) is True
    assert local_threads.parallel_decode(2) is False
    assert local_threads.parallel_decode(4) is False


@pytest.mark.parametrize("machine_cores, expected", [(2, False), (8, True)])
def test_a_run_hands_its_decoding_choice_to_the_stages(tmp_path, monkeypatch, machine_cores, expected):
    import rollout_relabel.pipeline.local_threads as local_threads
    import rollout_relabel.pipeline.output_parquet as run  # the folder run: threads, memory, its graph

    write_parquet_run(RunSpec(steps=2, prompts_per_step=2, files_per_step=1, seed=3), tmp_path / "in")
    monkeypatch.setattr(run, "available_memory", lambda: 100 * GB)
    monkeypatch.setattr(local_threads, "cores", lambda: machine_cores)  # 2 file groups: 2 threads either way
    seen = []
    build = run.build
    monkeypatch.setattr(run, "build", lambda p, settings, *rest: (seen.append(settings), build(p, settings, *rest))[1])
    run_cli("run", "--input", tmp_path / "in", "--output", tmp_path / "out")
    assert [s.parallel_decode for s in seen] == [expected]


def test_dumps_are_read_on_a_process_per_worker_thread_when_there_are_several():
    from rollout_relabel.pipeline.local_threads import pt_processes
    from rollout_relabel.transforms.lib.io.input_file import InputFile

    def files(*paths):
        return [InputFile(path=p, size=1, mtime=0.0, output="x") for p in paths]

    assert pt_processes(2, files("/d/0.pt", "/d/1.parquet")) == 2
    assert pt_processes(1, files("/d/0.pt")) == 0                    # one thread: it reads its own dumps
    assert pt_processes(2, files("/d/0.parquet")) == 0               # no dump: no pool
    assert pt_processes(2, files("gs://b/0.pt")) == 0                # a store's dumps are read in the thread


def test_a_run_over_dumps_reads_them_on_the_pool_and_writes_the_same_bytes(tmp_path, monkeypatch):
    import shutil

    import rollout_relabel.pipeline.local_threads as local_threads
    import rollout_relabel.pipeline.output_parquet as run  # the folder run: threads, memory, its graph
    from tests.conftest import FIXTURES

    shutil.copytree(f"{FIXTURES}/miles_rollout_data", tmp_path / "in")
    monkeypatch.setattr(run, "available_memory", lambda: 100 * GB)
    monkeypatch.setattr(local_threads, "cores", lambda: 2)  # two dumps, two cores: two threads
    seen = []
    build = run.build
    monkeypatch.setattr(run, "build", lambda p, settings, *rest: (seen.append(settings), build(p, settings, *rest))[1])
    run_cli("run", "--input", tmp_path / "in", "--output", tmp_path / "pool")
    run_cli("run", "--input", tmp_path / "in", "--output", tmp_path / "thread", "--direct_num_workers", "1")
    assert [s.pt_processes for s in seen] == [2, 0]
    for name in ("part-0.parquet", "part-1.parquet"):
        assert (tmp_path / "pool" / name).read_bytes() == (tmp_path / "thread" / name).read_bytes()


@pytest.mark.parametrize("flags,reshuffles", [
    ([], False),                                                        # the default: one thread, in process
    (["--direct_num_workers=2", "--direct_running_mode=multi_threading"], True),
    (["--direct_running_mode=multi_processing"], True),
    (["--runner=DirectRunner"], True),                                  # any other runner spreads its elements
])
def test_a_create_reshuffles_wherever_a_worker_may_share_its_elements(flags, reshuffles):
    options = parse("difficulty", ["--input", "in", "--output", "out", *flags]).options
    assert create_reshuffles(options) is reshuffles
