"""Atomic file output through Beam's FileSystems: write a temporary name, then rename."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from transforms.faults import crash_point

TEMP_PREFIX = ".tmp-"
LINEAGE_KEY = b"rollout_relabel"


def join(directory: str, name: str) -> str:
    return FileSystems.join(directory, name)


def write_parquet_atomically(table: pa.Table, directory: str, name: str, lineage: dict | None = None) -> None:
    """Write `table` as directory/name; the final name appears only once the file is complete."""
    if lineage is not None:
        metadata = dict(table.schema.metadata or {})
        metadata[LINEAGE_KEY] = json.dumps(lineage, sort_keys=True).encode()
        table = table.replace_schema_metadata(metadata)
    return _write_atomically(directory, name, lambda handle: pq.write_table(
        table, handle, **parquet_write_options(table.schema)))


def parquet_write_options(schema: pa.Schema) -> dict:
    """The floor's settings: zstd, dictionary encoding only for non-list columns."""
    flat = [f.name for f in schema if not (pa.types.is_list(f.type) or pa.types.is_large_list(f.type))]
    return {"compression": "zstd", "use_dictionary": flat, "write_statistics": True}


def write_bytes_atomically(data: bytes, directory: str, name: str) -> None:
    _write_atomically(directory, name, lambda handle: handle.write(data))


def _write_atomically(directory: str, name: str, write) -> None:
    """write(handle) fills a temporary file, streamed (never a whole copy in memory), then it is renamed."""
    final = join(directory, name)
    temp = join(directory, TEMP_PREFIX + name)
    with FileSystems.create(temp, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        write(handle)
    crash_point("before-rename", name)
    try:  # a local rename replaces the old file atomically
        FileSystems.rename([temp], [final])
    except Exception:  # noqa: BLE001 - stores whose rename refuses to overwrite
        FileSystems.delete([final])
        FileSystems.rename([temp], [final])
    crash_point("after-rename", name)


def read_json(path: str) -> dict | None:
    """A JSON file's content, or None when it does not exist."""
    if not FileSystems.exists(path):
        return None
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        return json.loads(handle.read())


def match_paths(pattern: str) -> list:
    """FileMetadata of the files matching pattern; none when nothing matches (Beam raises then)."""
    try:
        return [m for result in FileSystems.match([pattern]) for m in result.metadata_list]
    except Exception:  # noqa: BLE001
        return []


def delete_existing(paths) -> None:
    """Delete those of paths (files, or folders with what they hold) that exist."""
    existing = [p for p in paths if FileSystems.exists(p)]
    if existing:
        FileSystems.delete(existing)


def read_lineage(directory: str, name: str) -> dict | None:
    """The lineage record of an existing output file, or None when absent or unreadable."""
    path = join(directory, name)
    try:
        if not FileSystems.exists(path):
            return None
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            metadata = pq.ParquetFile(handle).metadata
        raw = (metadata.metadata or {}).get(LINEAGE_KEY)
        return dict(json.loads(raw), _rows=metadata.num_rows) if raw else None
    except Exception:  # noqa: BLE001 - a damaged file is simply not complete
        return None
