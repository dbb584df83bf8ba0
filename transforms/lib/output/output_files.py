"""Committed output files: written under a temporary name, then renamed; read back for lineage."""
from __future__ import annotations

import json
import uuid

import pyarrow as pa
import pyarrow.parquet as pq

from rollout_relabel.transforms.lib.io import filesystem
from rollout_relabel.transforms.lib.output.dead_letters import summarize
from rollout_relabel.transforms.lib.output.stage_outputs import ExcludedWritten
from rollout_relabel.transforms.lib.worker.faults import crash_point

TEMP_PREFIX = ".tmp-"
OLD_PREFIX = ".old-"
# Temporary names are unique to this process: two writers of one name never share a temporary file.
_WRITER = uuid.uuid4().hex[:12]
LINEAGE_KEY = b"rollout_relabel"


def write_parquet_atomically(table: pa.Table, directory: str, name: str, lineage: dict | None = None,
                             distinct: tuple[str, ...] = ()) -> None:
    """Write `table` as directory/name; the final name appears only once the file is complete. `distinct`:
    columns whose every value differs (a key), which a dictionary would only slow down."""
    if lineage is not None:
        metadata = dict(table.schema.metadata or {})
        metadata[LINEAGE_KEY] = json.dumps(lineage, sort_keys=True).encode()
        table = table.replace_schema_metadata(metadata)
    options = parquet_write_options(table.schema)
    options["use_dictionary"] = [column for column in options["use_dictionary"] if column not in distinct]
    _write_atomically(directory, name, lambda handle: pq.write_table(table, handle, **options))


def write_excluded(table: pa.Table, directory: str, name: str, kind: str, lineage: dict) -> ExcludedWritten:
    """Dead-letter or filtered records into directory/name (only when there is one), and the manifest's
    account of them."""
    if table.num_rows:
        write_parquet_atomically(table, directory, name, lineage=lineage)
    return summarize(table, kind, name)


def parquet_write_options(schema: pa.Schema) -> dict:
    """The floor's settings: zstd, dictionary encoding only for non-list columns."""
    flat = [f.name for f in schema if not (pa.types.is_list(f.type) or pa.types.is_large_list(f.type))]
    return {"compression": "zstd", "use_dictionary": flat, "write_statistics": True}


def write_bytes_atomically(data: bytes, directory: str, name: str) -> None:
    _write_atomically(directory, name, lambda handle: handle.write(data))


def commit_file(staged: str, directory: str, name: str) -> None:
    """A complete file written elsewhere in `directory` (a staged name) made directory/name, by a rename
    (never a copy through this process)."""
    crash_point("before-rename", name)
    _commit(staged, filesystem.join(directory, name), filesystem.join(directory, f"{OLD_PREFIX}{_WRITER}-{name}"))
    crash_point("after-rename", name)


def _write_atomically(directory: str, name: str, write) -> None:
    """write(handle) fills a temporary file, streamed (never a whole copy in memory), then it is renamed."""
    temp = filesystem.join(directory, f"{TEMP_PREFIX}{_WRITER}-{name}")
    try:
        with filesystem.create(temp) as handle:
            write(handle)
        commit_file(temp, directory, name)
    except BaseException:
        # a full disk, an interrupt: leave no temporary file behind (once renamed there is none to delete)
        filesystem.delete_existing([temp])
        raise


def _commit(temp: str, final: str, old: str) -> None:
    """Rename temp over final. A local rename replaces atomically; where a store refuses to overwrite,
    the committed file is moved aside first and put back if the rename still fails: a failed rename
    never deletes a committed file."""
    try:
        filesystem.rename(temp, final)
        return
    except Exception:  # noqa: BLE001 - the store's refusal to overwrite has no common type
        if not filesystem.exists(final) or not filesystem.exists(temp):
            raise
    filesystem.rename(final, old)
    try:
        filesystem.rename(temp, final)
    except Exception:
        filesystem.rename(old, final)
        raise
    filesystem.delete([old])


def read_json(path: str) -> dict | None:
    """A JSON file's content, or None when it does not exist."""
    if not filesystem.exists(path):
        return None
    with filesystem.open_read(path) as handle:
        return json.loads(handle.read())


def read_lineage(directory: str, name: str) -> dict | None:
    """The lineage record of an existing output file, or None when absent or damaged."""
    path = filesystem.join(directory, name)
    if not filesystem.exists(path):
        return None
    try:
        with filesystem.open_read(path) as handle:
            metadata = pq.ParquetFile(handle).metadata
        raw = (metadata.metadata or {}).get(LINEAGE_KEY)
        return dict(json.loads(raw), _rows=metadata.num_rows) if raw else None
    except (pa.ArrowInvalid, OSError, ValueError):  # a damaged or truncated file is simply not complete
        return None
