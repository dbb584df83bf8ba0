"""Keep a worker's resident memory close to the Arrow data it holds.

Parquet decoding and encoding free large scratch buffers that Arrow's
allocator (mimalloc in pyarrow's wheels) keeps for reuse. Measured on the
benchmark's T files (13 MB zstd, ~25 MB decoded each), reading and writing
them one after another: mimalloc as is, 203 ms a file and 352 MB peak;
mimalloc with release_unused() after each file, 198 ms and 269 MB; glibc
malloc, 239 ms and 303 MB (and with malloc_trim, reads took twice as long:
every buffer faulted its pages in again); jemalloc with decay 0, 287 ms.
"""
from __future__ import annotations

# Releasing costs milliseconds; tables this small leave little behind.
RELEASE_ABOVE_BYTES = 16 << 20


def release_free_memory(table_bytes: int) -> None:
    """After reading or writing a table of table_bytes: hand the allocator's free memory back if it was big."""
    if table_bytes < RELEASE_ABOVE_BYTES:
        return
    import pyarrow as pa
    pa.default_memory_pool().release_unused()
