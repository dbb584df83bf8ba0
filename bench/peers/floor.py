"""The floor: pyarrow reads every file, appends one float32 column, writes it back.

Same writer options as the pipeline (output_files.parquet_write_options:
zstd, dictionary encoding off for list columns). No semantics at all: the
least any implementation that rewrites every byte has to do.
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bench.peers.common import input_files, output_path, parquet_write_options, parse_args


def main() -> None:
    args = parse_args(__doc__)
    for path in input_files(args.input):
        table = pq.read_table(path)
        table = table.append_column("advantage", pc.cast(table.column("reward"), pa.float32()))
        pq.write_table(table, output_path(args.output, path, args.input), **parquet_write_options(table.schema))


if __name__ == "__main__":
    main()
