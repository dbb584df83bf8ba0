"""How many worker threads a local run uses when the user did not choose.

One per core, at most MAX_LOCAL_THREADS: pyarrow decodes, compresses and
writes without the GIL, so threads overlap one file group's I/O with
another's (1M rows: 9.4 s on one thread, 6.8 s on two, byte-identical
output). But each thread holds a whole file group in memory, and a group
may be up to a GiB of compressed Parquet: on a laptop, four such groups at
once would not fit. So the count is lowered until the largest groups that
could be in flight together fit in a share of the memory available, and it
never exceeds the number of groups (Beam hands each thread a fixed share of
them; a thread without one only costs start-up).
"""
from __future__ import annotations

import os

from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions

from rollout_relabel.pipeline.parse import DEFAULT_RUNNER
from rollout_relabel.transforms.lib.io import formats

MAX_LOCAL_THREADS = 4
# Peak memory a thread holds per byte of decoded input in its group (the input table, the new mask
# and training columns, write buffers): measured 2.0-2.4x on the benchmark's 1k-token data.
GROUP_MEMORY_FACTOR = 2.5
# The share of available memory the groups in flight may take: the rest is Beam, pyarrow's pools, others.
MEMORY_SHARE = 0.5


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def local_thread_count(most: int, group_bytes: list[int], available: int | None, shuffled: bool = False) -> int:
    """Threads for groups of these decoded sizes: at most `most`, fewer when memory or groups run short.

    `shuffled`: some files take the shuffle path, whose many small bundles use every thread.
    """
    threads = most if shuffled else min(most, len(group_bytes))
    largest = sorted(group_bytes, reverse=True)
    while (threads > 1 and available is not None
           and GROUP_MEMORY_FACTOR * sum(largest[:threads]) > MEMORY_SHARE * available):
        threads -= 1
    return max(1, threads)


def parallel_decode(threads: int) -> bool:
    """Whether pyarrow should decode each file on its own thread pool besides `threads` worker threads:
    only where those leave cores idle. With a worker on every core the two pools only take turns, and
    runs were slower (docs/performance.md)."""
    return threads < cores()


def pt_processes(threads: int, files) -> int:
    """Processes to read local files on whose format's reader holds the GIL (`.pt` dumps: unpickling): one
    per worker thread when there are several and such a file is local (0: each thread reads its own).
    Threads alone would take turns on the GIL; a process per thread lets them read together from the
    first file (docs/performance.md)."""
    local = any("://" not in f.path and (found := formats.detect(f.path)) is not None and found.reads_on_processes
                for f in files)
    return threads if threads > 1 and local else 0


def available_memory(cgroup: str = "/sys/fs/cgroup") -> int:
    """Bytes this process may still use: the machine's available memory, or less under a cgroup v2 limit."""
    import psutil

    available = psutil.virtual_memory().available
    try:
        with open(os.path.join(cgroup, "memory.max")) as limit, open(os.path.join(cgroup, "memory.current")) as used:
            text = limit.read().strip()
            if text != "max":
                available = min(available, max(0, int(text) - int(used.read().strip())))
    except (OSError, ValueError):  # no cgroup v2 memory controller here
        pass
    return available


def owns_local_threads(command: str, options: PipelineOptions, given) -> bool:
    """Whether the worker threads are ours to choose: the default local runner, and the user set neither
    --direct_running_mode nor --direct_num_workers (`given(*names)` says whether they did)."""
    return (command in ("run", "compare") and options.view_as(StandardOptions).runner == DEFAULT_RUNNER
            and not given("direct_running_mode", "direct_num_workers"))


def use_local_threads(options: PipelineOptions, threads: int) -> None:
    """Run on `threads` in-process worker threads (one: the plain in-memory runner, no gRPC workers)."""
    direct = options.view_as(DirectOptions)
    direct.direct_running_mode = "multi_threading" if threads > 1 else "in_memory"
    direct.direct_num_workers = threads


def create_reshuffles(options: PipelineOptions) -> bool:
    """Whether a `beam.Create` of a pipeline run with these options should redistribute its elements
    (Beam's default): on every runner but the default one on one worker thread. Elsewhere, all of a
    Create's elements come out of one bundle, and only the reshuffle lets several workers share them; on
    one thread there is nobody to share with, and the reshuffle is a stage more for each run to pay."""
    direct = options.view_as(DirectOptions)
    one_thread = direct.direct_num_workers == 1 and direct.direct_running_mode in (None, "in_memory")
    return not (options.view_as(StandardOptions).runner == DEFAULT_RUNNER and one_thread)


def claim_local_threads(command: str, parsed) -> int | None:
    """When the threads are ours to choose (owns_local_threads), start from one per core, at most
    MAX_LOCAL_THREADS (`run` lowers it once the inputs are known); returns that count, else None."""
    if not owns_local_threads(command, parsed.options, parsed.given):
        return None
    threads = min(cores(), MAX_LOCAL_THREADS)
    use_local_threads(parsed.options, threads)
    return threads
