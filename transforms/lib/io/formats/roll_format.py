"""ROLL's RLVR rollout dumps: `dump_rollout_to_specific_path` (alibaba/ROLL, roll/pipeline/rlvr/utils.py at
8eb27cc2dc34c4d1310b169d9b86d339004d811a) writes `{rollout_dump_dir}/rollout_dump_data.step_{N}.jsonl`, one
line holding the step's columns (each a list over the step's responses): `global_step`, `id`, `prompt`,
`messages`, `ground_truth`, `tag`, `domain`, ..., `responses` (decoded text), `scores` and
`sampling_params` (the batch's meta_info as JSON, its `generation_config` included).

ROLL's GRPO (roll/utils/functionals.py `reward_postprocess` -> `reward_norm`) reshapes the step's rewards
into consecutive groups of `num_return_sequences` and divides the centred reward by torch's (sample) std
plus 1e-6. The reader gives each row its group as that slice when the dump's `sampling_params` names
`num_return_sequences`, else as the run of consecutive rows sharing an `id`; `trajectory_id` is the row's
position in the step. Text only: no tokens, masks or logprobs.
"""
from __future__ import annotations

import json
import re

import msgspec
import pyarrow as pa

from rollout_relabel.transforms.core.reasons import Reason
from rollout_relabel.transforms.lib.errors import BadFile
from rollout_relabel.transforms.lib.io.formats.format import Format, ReadOptions, planned_by_name, read_bytes

PATTERN = re.compile(r"(?:^|/)rollout_dump_data\.step_(-?\d+)\.jsonl$")


def matches(path: str) -> bool:
    return PATTERN.search(path.replace("\\", "/")) is not None


def step_from_name(path: str) -> int | None:
    found = PATTERN.search(path.replace("\\", "/"))
    return int(found.group(1)) if found else None


def _group_size(sampling_params) -> int | None:
    """generation_config.num_return_sequences of the dump's meta_info (JSON text), when it names one."""
    try:
        meta = json.loads(sampling_params) if isinstance(sampling_params, str) else sampling_params
        n = meta["generation_config"]["num_return_sequences"]
    except (TypeError, ValueError, KeyError):
        return None
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def _groups(ids: list, n: int | None) -> list[int]:
    if n is not None:
        return [i // n for i in range(len(ids))]
    out, group = [], -1
    for i, key in enumerate(ids):
        group += i == 0 or key != ids[i - 1]
        out.append(group)
    return out


def _lines(data: bytes):
    """(number, line) for each line of the file, the lines as views: a step's line is megabytes, and copying it
    costs more than decoding it."""
    view, start, number = memoryview(data), 0, 0
    while start < len(data):
        end = data.find(b"\n", start)
        end = len(data) if end < 0 else end
        number += 1
        yield number, view[start:end]
        start = end + 1


def columns_of(data: bytes, path: str) -> dict[str, list]:
    """The step's columns, its lines' lists one after another (ROLL writes one line)."""
    merged: dict[str, list] = {}
    for number, line in _lines(data):
        try:
            columns = msgspec.json.decode(line)
        except (msgspec.DecodeError, RecursionError) as error:
            if bytes(line).isspace() or not len(line):  # a blank line
                continue
            raise BadFile(Reason.MALFORMED_LINE, f"{path}: line {number} is not JSON ({error})") from error
        if not isinstance(columns, dict) or not all(isinstance(v, list) for v in columns.values()):
            raise BadFile(Reason.MALFORMED_LINE, f"{path}: line {number} is not an object of column lists")
        sizes = {len(v) for v in columns.values()}
        if len(sizes) > 1:
            raise BadFile(Reason.MALFORMED_LINE, f"{path}: line {number}: its columns differ in length")
        if merged and set(columns) != set(merged):
            raise BadFile(Reason.MALFORMED_LINE, f"{path}: line {number} has other columns than line 1")
        if not merged:
            merged = columns  # the usual file: its one line, not copied
        else:
            for name, values in columns.items():
                merged[name].extend(values)
    return merged


def _arrays(columns: dict[str, list], path: str) -> pa.Table:
    """The step's column lists as Arrow columns, each typed from its values (a column mixing kinds of values,
    or holding an integer beyond int64, cannot be: the file is refused naming the column)."""
    arrays = {}
    for name, values in columns.items():
        try:
            arrays[name] = pa.array(values)
        except (pa.ArrowException, OverflowError, TypeError) as error:
            raise BadFile(Reason.ILL_TYPED_COLUMN, f"{path}: column `{name}` cannot be typed ({error})") from error
    return pa.table(arrays)


def read(path: str, columns, options: ReadOptions):
    data = read_bytes(path)
    if options.max_bytes is not None and len(data) > options.max_bytes:
        raise BadFile(Reason.FILE_TOO_LARGE, f"{path}: larger than --max-file-bytes")
    table = _arrays(columns_of(data, path), path)
    n_rows = table.num_rows
    names = table.column_names
    if n_rows and "id" not in names and "sampling_params" not in names:
        raise BadFile(Reason.MISSING_COLUMN, f"{path}: neither `id` nor `sampling_params`: no prompt groups")
    size = _group_size(table.column("sampling_params")[0].as_py()) if n_rows and "sampling_params" in names else None
    ids = table.column("id").to_pylist() if "id" in names else [None] * n_rows
    table = table.append_column("group_index", pa.array(_groups(ids, size), pa.int64()))
    table = table.append_column("trajectory_id", pa.array(range(n_rows), pa.int64()))
    if columns is not None:
        table = table.select([c for c in table.column_names if c in columns])
    return table, {"step": step_from_name(path), "prompt_group_sizes": None}


FORMAT = Format("roll", matches=matches, read=read, plan=planned_by_name(step_from_name), step_from_name=step_from_name,
                preset=("--column=reward=scores", "--column=step=global_step", "--column=rollout_id=trajectory_id",
                        "--semantics=group-index"))
