"""The input formats: one module each in this folder, one row each in FORMATS.

Every other place asks this registry: listing (which files are inputs, their output names), planning (a
file's footer), reading (a file into the input table), local threads (which reader holds the GIL),
export (which inputs carry a dump layout) and the CLI (`--format NAME`'s flags). A new format is a module
here defining `FORMAT = Format(...)` (format.py says what each field means) and its row below; no suffix
is written anywhere else (tests/transforms/lib/io/formats/test_registry.py reads the source to hold that).
"""
from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from rollout_relabel.transforms.core.reasons import Reason
from rollout_relabel.transforms.lib.errors import BadFile
from rollout_relabel.transforms.lib.io.formats import (
    areal_format,
    jsonl_format,
    miles_details_format,
    miles_format,
    nemo_rl_format,
    parquet_format,
    prime_rl_format,
    pt_format,
    rllm_format,
    roll_format,
    skyrl_format,
    slime_format,
    trl_format,
    verl_format,
)
from rollout_relabel.transforms.lib.io.formats.format import Footer, Format, ReadOptions

# Detection asks the rows in this order and the first that claims a file reads it: a row matching a file
# name pattern goes before the row of the suffix it shares. Rows without a reader are presets only.
FORMATS: tuple[Format, ...] = (
    miles_details_format.FORMAT,  # `rollout_data/N.pt`: before pt's suffix
    pt_format.FORMAT,
    parquet_format.FORMAT,
    roll_format.FORMAT,  # rollout_dump_data.step_N.jsonl: before the .jsonl row
    prime_rl_format.FORMAT,  # step_N/train/{all,effective}/traces.jsonl: before the .jsonl row
    jsonl_format.FORMAT,
    slime_format.FORMAT,
    miles_format.FORMAT,
    verl_format.FORMAT,
    areal_format.FORMAT,
    nemo_rl_format.FORMAT,
    trl_format.FORMAT,
    rllm_format.FORMAT,  # its own pattern (`.json` under train_step_N_epoch_E/): no other row claims it
    skyrl_format.FORMAT,  # its own pattern (`global_step_N_training_input.pkl`): no other row claims it
)

__all__ = ["FORMATS", "Footer", "Format", "ReadOptions", "by_name", "companions", "detect", "format_of",
           "plan", "preset_names", "read_table", "suffixes"]


def detect(path: str) -> Format | None:
    """The format that reads `path`, None when no row claims it."""
    return next((f for f in FORMATS if f.claims(path)), None)


def format_of(path: str) -> Format:
    """detect(path), or BadFile (unreadable-file) naming the file and what is read."""
    found = detect(path)
    if found is None:
        raise BadFile(Reason.UNREADABLE_FILE, f"{path}: unknown file type (expected {described()})")
    return found


def by_name(name: str) -> Format | None:
    return next((f for f in FORMATS if f.name == name), None)


def preset_names() -> tuple[str, ...]:
    """`--format`'s choices: the rows with flags to stand for."""
    return tuple(f.name for f in FORMATS if f.preset)


def suffixes() -> tuple[str, ...]:
    return tuple(s for f in FORMATS if f.read is not None for s in f.suffixes)


def described() -> str:
    """What is read, for messages: the suffixes, and the formats detected by a pattern by name."""
    named = [f"{f.name} files" for f in FORMATS if f.read is not None and f.matches is not None]
    return ", ".join([*suffixes(), *named])


def companions(listing: Sequence[str]) -> set[str]:
    """Of the paths a listing found, those a format reads along with its own files (or that are no
    rollouts): never inputs of their own."""
    return {p for f in FORMATS if f.companions is not None for p in f.companions(listing)}


def read_table(path: str, columns=None, options: ReadOptions = ReadOptions()) -> tuple[pa.Table, dict]:
    """The file's rows (only `columns` when given, those present) and its batch metadata, read by its
    format. A format taking the step from the file name gives a file without a `step` column that step.

    metadata: {"step": int | None, "prompt_group_sizes": list[int] | None}
    """
    found = format_of(path)
    if found.read is None:  # detect() finds formats by their files: each has a reader
        raise BadFile(Reason.UNREADABLE_FILE, f"{path}: the {found.name} format reads no file")
    table, metadata = found.read(path, columns, options)
    step = found.step_from_name(path) if found.step_from_name is not None else None
    if step is not None and "step" not in table.column_names and (columns is None or "step" in columns):
        table = table.append_column("step", pa.array([step] * table.num_rows, pa.int64()))
        metadata = dict(metadata, step=step)
    return table, metadata


def plan(path: str, size: int, step: str, max_bytes: int) -> Footer:
    """The file's footer, by its format (a regular file within --max-file-bytes); a file whose format takes
    the step from its name and whose footer shows none is planned with that step."""
    found = format_of(path)
    if found.plan is None:  # as in read_table
        raise BadFile(Reason.UNREADABLE_FILE, f"{path}: the {found.name} format plans no file")
    footer = found.plan(path, size, step, max_bytes)
    named = found.step_from_name(path) if found.step_from_name is not None else None
    return footer if footer.steps is not None or named is None else Footer((named, named), footer.decoded_bytes)
