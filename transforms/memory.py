"""Keep a worker's resident memory close to the Arrow data it holds.

Measured on the benchmark's T files (24.6 MB decoded each): with pyarrow's
default mimalloc pool a read left ~+80 MB resident per file; with the system
allocator and glibc's malloc_trim after each read and write, ~+30 MB. Parquet
decoding frees large scratch buffers that the allocators otherwise keep.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools


def use_system_allocator() -> None:
    """Arrow allocations through malloc, so release_free_memory() can hand them back (a worker-wide choice,
    made in DoFn.setup: the pipeline's DoFns are the only Arrow users in a worker)."""
    import pyarrow as pa
    pa.set_memory_pool(pa.system_memory_pool())


# A trim costs milliseconds and makes the next allocations fault their pages in again: measured on
# M (100 files of ~2 MB decoded) trimming after every file cost 2-3 s of 14, for ~25 MB less peak.
TRIM_ABOVE_BYTES = 16 << 20


def release_free_memory(table_bytes: int) -> None:
    """After reading or writing a table of table_bytes: give the freed scratch memory back if it was big."""
    if table_bytes < TRIM_ABOVE_BYTES:
        return
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None where the C library has none (macOS, musl)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
