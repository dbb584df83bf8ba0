"""The two-core floor: the floor's work (read each file, append one float32 column, write it) with the
files split over one process per core, as an implementation that used both cores from its first file
would. No semantics at all; a bound, not a peer (its output is not checked against the pipeline's).
"""
from __future__ import annotations

import multiprocessing
import os

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bench.peers.common import input_files, output_path, parquet_write_options, parse_args


def _rewrite(job: tuple[str, str, str]) -> None:
    path, output_dir, input_dir = job
    table = pq.read_table(path)
    table = table.append_column("advantage", pc.cast(table.column("reward"), pa.float32()))
    pq.write_table(table, output_path(output_dir, path, input_dir), **parquet_write_options(table.schema))


def main() -> None:
    args = parse_args(__doc__)
    files = input_files(args.input)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    jobs = [(path, args.output, args.input) for path in files]
    # every core-th file to each process, in order: the split a static partitioner makes
    with multiprocessing.get_context("fork").Pool(cores) as pool:
        pool.map(_rewrite, jobs, chunksize=max(1, len(jobs) // cores))


if __name__ == "__main__":
    main()
