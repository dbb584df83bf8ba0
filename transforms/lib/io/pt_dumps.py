"""slime / miles `.pt` dumps into Arrow tables, without Beam: a worker process runs this (readers.py).

The dump is loaded with safe_pickle (what `torch.load(weights_only=True)` gives, on the C unpickler),
checked to be a rollout dump nested no deeper than MAX_DEPTH, and turned into a table (dump_samples.py).
Whatever else goes wrong while reading one (an error of Python's or Arrow's on a strange value) makes
the file unreadable, never the run fail; a reader that dies is the worker pool's to report
(lib/worker/processes.py). The bounds of one file's reading (`bounds`) are documented in
docs/bad-input.md.
"""
from __future__ import annotations

import io
import os
from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa

from rollout_relabel.transforms.core.reasons import Reason
from rollout_relabel.transforms.lib.errors import BadFile, printable
from rollout_relabel.transforms.lib.io import safe_pickle
from rollout_relabel.transforms.lib.io.dump_samples import samples_to_table
from rollout_relabel.transforms.lib.io.jsonl import MAX_DEPTH

# Each dump's reading is bounded (docs/bad-input.md): a file past a bound is dead-lettered as
# file-too-costly. Rollout dumps read in about a second of CPU time per 20 MB with a resident memory of
# about 12 times their size over the reader's own; the bounds leave a wide margin over both (a dump of
# many small lists takes more memory for its size than one of long token lists).
SECONDS, SECONDS_PER_MIB = 30.0, 1.0
MEMORY, MEMORY_PER_BYTE = 1 << 30, 64
_NESTED = (list, tuple, dict, set, frozenset)
_TEXT_KEYS = frozenset((str,))


def bounds(size: int) -> tuple[float, int]:
    """(seconds of CPU time, bytes of resident memory) the reader of a dump of `size` bytes may take."""
    return SECONDS + SECONDS_PER_MIB * size / (1 << 20), MEMORY + MEMORY_PER_BYTE * size


@dataclass(frozen=True)
class DumpOutcome:
    """A dump read in another process: the table and metadata, or why the file is bad (as BadFile's)."""
    table: pa.Table | None = None
    metadata: dict | None = None
    reason: str | None = None
    message: str | None = None

    def unwrap(self) -> tuple[pa.Table, dict]:
        if self.reason is not None:
            raise BadFile(self.reason, self.message or self.reason)
        if self.table is None or self.metadata is None:
            raise ValueError("a DumpOutcome holds the table and its metadata, or why the file is bad")
        return self.table, self.metadata


def read_dump_outcome(path: str, raw: bytes | None = None, columns=None) -> DumpOutcome:
    """read_dump, its BadFile as a value (it travels back from a worker process as data)."""
    try:
        table, metadata = read_dump(path, raw, columns)
    except BadFile as bad:
        return DumpOutcome(reason=bad.reason, message=bad.message)
    return DumpOutcome(table, metadata)


def read_dump(path: str, raw: bytes | None, columns=None) -> tuple[pa.Table, dict]:
    """The dump at `path` (a local file, read through a memory map) or in `raw` (a store's object's bytes).

    Raises BadFile for every file it cannot turn into a table, whatever the error."""
    return costs_its_file(path, _read_dump, path, raw, columns)


def costs_its_file(path: str, read, *args):
    """read(*args), any failure of it a BadFile naming `path`: a strange value in a file must cost that file,
    never the run (the .pt and SkyRL readers on their worker processes)."""
    try:
        return read(*args)
    except BadFile:
        raise
    except MemoryError as error:
        raise BadFile(Reason.FILE_TOO_COSTLY, f"{path}: reading it ran out of memory ({error})") from error
    except Exception as error:  # noqa: BLE001 - a strange value must cost its file, never the run
        raise BadFile(Reason.UNREADABLE_FILE, f"{path}: cannot be read: {error_text(error)}") from error


def error_text(error: BaseException) -> str:
    """An error as one short line of valid text (a value in it may hold a lone surrogate)."""
    text = f"{type(error).__name__}: {error}"
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return printable(text if len(text) <= 300 else text[:300] + "...")


def _read_dump(path: str, raw: bytes | None, columns=None) -> tuple[pa.Table, dict]:
    if (raw is not None and not raw) or (raw is None and _local_size(path) == 0):
        raise BadFile(Reason.EMPTY_FILE, f"{path}: file is empty (0 bytes)")
    try:
        dump = safe_pickle.load(path=path if raw is None else None, data=raw)
    except (safe_pickle.UnsafePickle, safe_pickle.UnreadableDump) as error:
        looks_like = _looks_like(*_ends(path, raw))
        if looks_like:
            raise BadFile(Reason.UNREADABLE_FILE, f"{path}: {looks_like}, not a .pt dump") from error
        if isinstance(error, safe_pickle.UnsafePickle):
            raise BadFile(Reason.UNSAFE_PICKLE, f"{path}: refused: the dump needs arbitrary unpickling, which could "
                                           f"run code ({error})") from error
        raise BadFile(Reason.UNREADABLE_FILE, f"{path}: corrupt or truncated .pt: {error}") from error
    if _deeper_than(dump, MAX_DEPTH):
        raise BadFile(Reason.UNREADABLE_FILE, f"{path}: nested deeper than {MAX_DEPTH} levels (the dump itself is "
                                              "the first)")
    if not isinstance(dump, dict) or not isinstance(dump.get("samples"), list):
        raise BadFile(Reason.UNREADABLE_FILE, f"{path}: not a rollout dump (expected a dict with a 'samples' list)")
    samples = dump["samples"]
    if not all(isinstance(s, dict) for s in samples):
        raise BadFile(Reason.UNREADABLE_FILE, f"{path}: 'samples' must be a list of dicts (Sample.to_dict())")
    for position, sample in enumerate(samples):
        odd = next((key for key in sample if not isinstance(key, str)), None)
        if odd is not None:
            raise BadFile(Reason.ILL_TYPED_COLUMN, f"{path}: sample {position} has a non-string key {odd!r}")
    metadata = dump.get("metadata") or {}
    sizes = metadata.get("prompt_group_sizes") if isinstance(metadata, dict) else None
    if sizes is not None and not (isinstance(sizes, (list, tuple)) and all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in sizes)):
        raise BadFile(Reason.GROUP_SIZES_MISMATCH, f"{path}: metadata prompt_group_sizes is {sizes!r}; expected a list "
                                              "of non-negative integers")
    step = dump.get("rollout_id")
    try:
        table = samples_to_table(samples, columns, dump=dump)
    except BadFile as bad:
        raise BadFile(bad.reason, f"{path}: {bad.message}") from bad
    return table, {
        "step": step if isinstance(step, int) else None,
        "prompt_group_sizes": None if sizes is None else [int(s) for s in sizes],
    }


def _deeper_than(value, limit: int) -> bool:
    """Whether containers nest in `value` more than `limit` levels deep (`value` itself the first), found
    without recursion: Python's hash of a tuple, Arrow's conversion and repr() all recurse once per level
    (and crash the process long before a million). One level at a time; a list of numbers (tokens, masks,
    log-probs) is passed over in one C-level pass: sum() takes it only when no element is a container."""
    level = [value] if isinstance(value, _NESTED) else []
    for _ in range(limit):
        below = []
        for item in level:
            elements: Iterable = item
            if isinstance(item, dict):
                if not _TEXT_KEYS.issuperset(map(type, item)):  # keys may nest too (a tuple key)
                    below += [key for key in item if isinstance(key, _NESTED)]
                elements = item.values()
            try:
                sum(elements, 0)
                continue
            except Exception:  # noqa: BLE001 - not all numbers: look at each element
                below += [child for child in elements if isinstance(child, _NESTED)]
        if not below:
            return False
        level = below
    return True


def _local_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError as error:
        raise BadFile(Reason.UNREADABLE_FILE, f"{path}: cannot be read: {error}") from error


def _ends(path: str, raw: bytes | None) -> tuple[bytes, bytes]:
    """The first 4 KiB and the last 4 bytes of a file that failed to load (only read then)."""
    if raw is not None:
        return raw[:4096], raw[-4:]
    try:
        with open(path, "rb") as handle:
            head = handle.read(4096)
            handle.seek(max(0, handle.seek(0, io.SEEK_END) - 4))
            return head, handle.read(4)
    except OSError:
        return b"", b""


def _looks_like(head: bytes, tail: bytes) -> str | None:
    """What a file named .pt really is, when it is something we can name."""
    if head[:4] == b"PAR1" and tail == b"PAR1":
        return "a Parquet file (name it .parquet)"
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return "a text file"
