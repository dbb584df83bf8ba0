"""What an input format is: the one type every format module fills in (its row in formats/__init__.py).

A format says how its files are found in a listing, planned (their steps and size, from a footer when
there is one) and read into the input table, and which flags `--format NAME` stands for. Everything
else (listing, planning, reading, local threads, backfill, export) asks the registry, never a suffix.
No Beam here.
"""
from __future__ import annotations

import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import BinaryIO

import pyarrow as pa
import pyarrow.compute as pc

from rollout_relabel.transforms.core.reasons import Reason
from rollout_relabel.transforms.lib.errors import BadFile
from rollout_relabel.transforms.lib.io import filesystem
from rollout_relabel.transforms.lib.io.columns import lookup_path


@dataclass(frozen=True)
class ReadOptions:
    """How a file is read (the run's settings, not the file's): read_table's arguments."""
    use_threads: bool = True  # Parquet columns decoded on pyarrow's thread pool (off: on the calling thread)
    max_bytes: int | None = None  # a compressed file is refused once it decompresses to more (file-too-large)
    processes: int = 0  # > 1: a format whose reader holds the GIL reads a local file on a pool of processes
    # Parquet columns read dictionary-encoded, as stored where they are (text whose few values repeat, such as
    # prompts): decoding skips building each row's copy of the text
    dictionary: tuple[str, ...] = ()


@dataclass(frozen=True)
class Footer:
    """What a file tells the plan before it is read whole."""
    steps: tuple[int, int] | None  # (min, max) of `step`; None without one (or unreadable)
    decoded_bytes: int             # the file's size once decoded into Arrow (estimated)


# (path, the columns wanted (None: all), how) -> (the rows, {"step": int | None, "prompt_group_sizes": ...})
Reader = Callable[[str, Sequence[str] | None, ReadOptions], tuple[pa.Table, dict]]
# (path, size in bytes, the step column's name or dotted path, --max-file-bytes) -> Footer; the file is a
# regular file no larger than the limit. Never raises for a bad file: the one-pass path reports it.
Planner = Callable[[str, int, str, int], Footer]
# (a binary handle on the file, the size a listing saw) -> whether those bytes end where the format ends:
# `relabel watch` takes a stable file only then (lib/watch/whole_files.py), so the head of a file written in
# place, paused mid-file, is never read for the file. Reads only what it needs (the file's ends).
EndCheck = Callable[[BinaryIO, int], bool]


@dataclass(frozen=True)
class Format:
    """One input format: a module of formats/ defines it, one row of formats.FORMATS lists it.

    Detection: a listed file is this format's when its lower-cased name ends with one of `suffixes`, or
    when `matches(path)` says so (a file-name pattern such as `rollout_dump_data.step_N.jsonl`); the
    registry asks its rows in order, the first that claims a file reads it, so a pattern's row goes before
    the row of the suffix it shares. A format without either is never detected: it is a preset only, over
    files another row reads (verl's `.jsonl`).
    """
    name: str
    suffixes: tuple[str, ...] = ()
    matches: Callable[[str], bool] | None = None
    read: Reader | None = None
    plan: Planner | None = None
    # `--format NAME`: the flags placed before the command line's (so any of them can be overridden)
    preset: tuple[str, ...] = ()
    # `relabel compare --format NAME`: the column holding the framework's own advantage (side A's default)
    stored_advantage: str | None = None
    # why `--format NAME` refuses rescoring (--reward-fn, --rm-url, --reward-model); None: it allows it
    no_rescoring: str | None = None
    # a folder layout: of every path a listing found, those that are this format's companions (read with
    # its files, or not rollouts at all): never listed as inputs, so nothing is read twice
    companions: Callable[[Sequence[str]], set[str]] | None = None
    # the batch's step when the file name holds it (`..._step_12.jsonl`): a file without a `step` column
    # gets that step on every row, and the plan groups files by it
    step_from_name: Callable[[str], int | None] | None = None
    # its reader holds the GIL (an unpickler): a local run reads its local files on processes
    reads_on_processes: bool = False
    # its rows carry a dump layout: `relabel export` writes them back in the framework's own layout
    dump_layout: bool = False
    # where its files end (an EndCheck); None: no end marker, a stable size alone says a file has landed
    ends_whole: EndCheck | None = None

    def claims(self, path: str) -> bool:
        if self.read is None:
            return False
        if self.suffixes and path.replace("\\", "/").rsplit("/", 1)[-1].lower().endswith(self.suffixes):
            return True
        return self.matches is not None and self.matches(path)

    def stem(self, name: str) -> str:
        """`name` without this format's suffix (the longest it ends with), else without its extension."""
        ending = max((s for s in self.suffixes if name.lower().endswith(s)), key=len, default=None)
        return name[:-len(ending)] if ending else os.path.splitext(name)[0]


def planned_by_name(step_from_name: Callable[[str], int | None]) -> Callable[[str, int, str, int], Footer]:
    """The `plan` of a text layout whose step is in its file name (nothing to read before the run): that
    step, and twice the file's bytes as its decoded size."""
    def plan(path: str, size: int, step: str, max_bytes: int) -> Footer:
        named = step_from_name(path)
        return Footer(None if named is None else (named, named), size * 2)
    return plan


def planned_by_reading(read: Reader) -> Planner:
    """The `plan` of a text layout with no footer: the file is read for its `step` values alone, and its
    decoded size guessed at twice its bytes (text and its Arrow columns are of a size). A file that cannot
    be read is planned without steps: the one-pass path reports it."""
    def plan(path: str, size: int, step: str, max_bytes: int) -> Footer:
        try:
            table, _ = read(path, [step, step.split(".", 1)[0]], ReadOptions(max_bytes=max_bytes))
            return Footer(steps_in(table, step), size * 2)
        except BadFile:
            return Footer(None, size * 2)
    return plan


def tail(handle: BinaryIO, size: int, reach: int) -> bytes:
    """The last `reach` bytes of the first `size` bytes of the file (an EndCheck's read)."""
    start = max(0, size - reach)
    handle.seek(start)
    return handle.read(size - start)


def read_bytes(path: str) -> bytes:
    """A whole file's bytes (a format with no streaming reader)."""
    try:
        with filesystem.open_read(path) as handle:
            return handle.read()
    except Exception as error:  # noqa: BLE001 - any I/O failure makes the file unreadable
        raise BadFile(Reason.UNREADABLE_FILE, f"{path}: cannot be read: {error}") from error


def check_regular(path: str) -> None:
    """Only regular files are read (a local path's target, symlinks followed); stores hold nothing else."""
    if "://" in path:
        return
    try:
        mode = os.stat(path).st_mode
    except OSError as error:
        raise BadFile(Reason.UNREADABLE_FILE, f"{path}: cannot be read: {error}") from error
    if not stat.S_ISREG(mode):
        kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "a socket" if stat.S_ISSOCK(mode) else "a directory" if stat.S_ISDIR(mode) else "special")
        raise BadFile(Reason.UNREADABLE_FILE, f"{path}: not a regular file ({kind}); only regular files are read")


def steps_in(table: pa.Table, step: str):
    """(min, max) of the integer steps at `step` (a column or a dotted path) in `table`; None without any
    (or ill-typed, or a duplicate column: the one-pass path dead-letters such a file)."""
    names = table.column_names
    if names.count(step) > 1 or (step not in names and names.count(step.split(".", 1)[0]) > 1):
        return None
    values, _ = lookup_path(table, step, "step")
    if values is None:
        return None
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    values = values.drop_null()
    if len(values) == 0 or not pa.types.is_integer(values.type):
        return None
    return pc.min(values).as_py(), pc.max(values).as_py()
