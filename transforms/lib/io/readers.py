"""Reading a planned input into an Arrow table: checked (its name, a regular file, its size, unchanged since
the plan) and read by its format (transforms/lib/io/formats/).

Every byte goes through transforms/lib/io/filesystem.py, so gs://, s3://, hdfs:// and
mem:// paths work like local ones. No Beam pipeline code here.
"""
from __future__ import annotations

import pyarrow as pa

from rollout_relabel.transforms.core.reasons import Reason
from rollout_relabel.transforms.lib.errors import BadFile, InputChanged
from rollout_relabel.transforms.lib.io import filesystem, formats
from rollout_relabel.transforms.lib.io.formats.format import ReadOptions, check_regular
from rollout_relabel.transforms.lib.io.input_file import InputFile
from rollout_relabel.transforms.lib.settings import DEFAULT_MAX_FILE_BYTES


def read_input(f: InputFile, columns=None, max_bytes: int = DEFAULT_MAX_FILE_BYTES,
               use_threads: bool = True, processes: int = 0, dictionary: tuple[str, ...] = ()
               ) -> tuple[pa.Table, dict]:
    """An input as the plan listed it, read with read_table.

    Refused (BadFile) before any byte is read when its name cannot travel, it is not a regular file
    (a FIFO would hang the run, /dev/zero would fill memory) or it is over max_bytes; InputChanged
    when its size or mtime is no longer what the plan saw. `use_threads`, `processes`, `dictionary`: as
    read_table's.
    """
    if f.problem:
        raise BadFile(f.problem, f"{f.path}: its name is not valid UTF-8; rename the file to relabel it")
    check_regular(f.path)
    if f.size > max_bytes:
        raise BadFile(Reason.FILE_TOO_LARGE, f"{f.path}: {f.size} bytes is over the {max_bytes}-byte limit "
                                             "(--max-file-bytes)")
    table, metadata = read_table(f.path, columns, use_threads, max_bytes, processes, dictionary)
    _check_unchanged(f)
    return table, metadata


def _check_unchanged(f: InputFile) -> None:
    found = filesystem.stat(f.path)
    now = (int(found.size_in_bytes), float(found.last_updated_in_seconds)) if found else None
    if now != (f.size, f.mtime):
        seen = "gone" if now is None else f"{now[0]} bytes, mtime {now[1]}"
        raise InputChanged(f"{f.path} changed while the run read it (planned: {f.size} bytes, "
                           f"mtime {f.mtime}; now: {seen}); nothing is committed, rerun to relabel it as it "
                           "is now")


def read_table(path: str, columns=None, use_threads: bool = True, max_bytes: int = DEFAULT_MAX_FILE_BYTES,
               processes: int = 0, dictionary: tuple[str, ...] = ()) -> tuple[pa.Table, dict]:
    """The file's rows (only `columns` when given, those present) and its batch metadata, read by its format
    (formats.read_table).

    `use_threads`: Parquet columns are decoded on pyarrow's thread pool (off: on the calling thread).
    `max_bytes`: a compressed file is refused once it decompresses to more (file-too-large).
    `processes` > 1: a local file whose reader holds the GIL is read on a pool of that many processes
    (lib/worker/processes.py); a `.pt` dump always is, on one at least (formats/pt_format.py).
    `dictionary`: Parquet columns read dictionary-encoded where they are text (other formats ignore it).

    metadata: {"step": int | None, "prompt_group_sizes": list[int] | None}
    """
    return formats.read_table(path, columns, ReadOptions(use_threads, max_bytes, processes, tuple(dictionary)))
