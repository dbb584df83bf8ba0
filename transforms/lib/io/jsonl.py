"""JSON Lines rollouts (.jsonl, .jsonl.gz) as an Arrow table, malformed lines kept as dead-letter rows.

Bytes in, table out: readers.py reads the bytes; slim extraction reads malformed_lines() back. No Beam.
"""
from __future__ import annotations

import gzip
import io
import json
import zlib

import pyarrow as pa
import pyarrow.json as pajson

from rollout_relabel.transforms.core.reasons import Reason
from rollout_relabel.transforms.lib.errors import BadFile

# schema metadata naming the rows whose line was not a JSON object ({row: why})
MALFORMED_LINES = b"rollout_relabel.malformed_lines"


def read_jsonl(path: str, raw: bytes, columns=None) -> pa.Table:
    """One row per non-blank line, read with pyarrow's JSON reader (types inferred over the whole file).

    pyarrow fails the whole file on one bad line: a file it refuses is read again line by line with
    `json`, only to find the lines that are not JSON objects; the good lines are then read by pyarrow
    again, and each bad line becomes an all-null row at its position, named in the schema metadata
    (MALFORMED_LINES) so that slim extraction dead-letters it (malformed-line) with its line number.
    """
    if path.lower().endswith(".gz"):
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as error:
            raise BadFile(Reason.UNREADABLE_FILE, f"{path}: not a readable gzip file: {error}") from error
    if not raw.strip():
        raise BadFile(Reason.EMPTY_FILE, f"{path}: file is empty (no JSON lines)")
    malformed = {}
    try:
        table = _parse_json_lines(raw)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        lines = [line for line in raw.split(b"\n") if line.strip()]
        numbers = [n for n, line in enumerate(raw.split(b"\n"), start=1) if line.strip()]
        good, take = [], []
        for row, (number, line) in enumerate(zip(numbers, lines)):
            why = _line_problem(line)
            if why is None:
                take.append(len(good))
                good.append(line)
            else:
                take.append(None)
                snippet = line[:120].decode("utf-8", "backslashreplace")
                malformed[str(row)] = f"line {number} is not a JSON object ({why}): {snippet!r}"
        if not malformed:  # every line parses alone: the types conflict across lines
            try:
                table = pa.Table.from_pylist([json.loads(line) for line in lines])
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as error:
                raise BadFile(Reason.ILL_TYPED_COLUMN, f"{path}: the lines' fields do not share one type each: "
                                                  f"{error}") from error
        else:
            try:
                table = _parse_json_lines(b"\n".join(good)) if good else None
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
                raise BadFile(Reason.ILL_TYPED_COLUMN, f"{path}: the lines' fields do not share one type each: "
                                                  f"{error}") from error
            # a null index takes an all-null row: each bad line keeps its position
            table = (table.take(pa.array(take, pa.int64())) if table is not None and table.num_columns
                     else pa.table({"reward": pa.nulls(len(take))}))
    twice = sorted({n for n in table.column_names if table.column_names.count(n) > 1})
    if twice:
        raise BadFile(Reason.DUPLICATE_COLUMN, f"{path}: column name(s) {', '.join(map(repr, twice))} appear more "
                                          "than once")
    if columns is not None:
        table = table.select([c for c in dict.fromkeys(columns) if c in table.column_names])
    if malformed:
        table = table.replace_schema_metadata({MALFORMED_LINES: json.dumps(malformed).encode()})
    return table


def _parse_json_lines(raw: bytes) -> pa.Table:
    # one block for the whole file: types are inferred from every line, not from the first block's
    options = pajson.ReadOptions(block_size=max(len(raw) + 1, 1 << 20))
    return pajson.read_json(io.BytesIO(raw), read_options=options)


def _line_problem(line: bytes) -> str | None:
    try:
        value = json.loads(line)
    except (ValueError, UnicodeDecodeError) as error:
        return str(error).split(":")[0]
    return None if isinstance(value, dict) else f"a JSON {type(value).__name__}"


def malformed_lines(table: pa.Table) -> dict[int, str]:
    """{row: why} for the rows of a JSONL table whose line was not a JSON object."""
    raw = (table.schema.metadata or {}).get(MALFORMED_LINES)
    return {int(k): v for k, v in json.loads(raw).items()} if raw else {}
