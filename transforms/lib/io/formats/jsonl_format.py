"""JSON Lines rollout files (`.jsonl`, and gzip-compressed `.jsonl.gz`): one row per line.

The file is read whole and parsed by io/jsonl.py (malformed lines become dead-letter rows). JSONL has no
footer: planning parses the file for its `step` values (JSONL dumps are small).
"""
from __future__ import annotations

import json
import zlib

from rollout_relabel.transforms.lib.io.formats.format import Format, ReadOptions, planned_by_reading, read_bytes, tail
from rollout_relabel.transforms.lib.io.jsonl import read_jsonl

GZIPPED = ".jsonl.gz"


def read(path: str, columns, options: ReadOptions):
    table = read_jsonl(path, read_bytes(path), columns, options.max_bytes, gzipped=path.lower().endswith(GZIPPED))
    return table, {"step": None, "prompt_group_sizes": None}


GZIP_MAGIC = b"\x1f\x8b"
LAST_LINE_REACH = 1 << 20  # a last line without a newline is parsed up to this length
CHUNK = 1 << 20


def ends_whole(handle, size: int) -> bool:
    """JSONL: the last line ends with a newline, or that last line parses as JSON (a head cut at a line's
    end is a whole file of fewer rows: JSONL cannot tell, docs/streaming.md). gzip: every member reaches
    its end marker (decompressed into nothing kept)."""
    if size == 0:
        return False
    if handle.read(2) == GZIP_MAGIC:
        handle.seek(0)
        return _gzip_ends(handle)
    end = tail(handle, size, LAST_LINE_REACH)
    if end.endswith(b"\n"):
        return True
    last = end.rsplit(b"\n", 1)[-1]
    if len(last) == len(end) and size > len(end):
        return False  # one line longer than the reach: wait for its newline
    try:
        json.loads(last)
    except ValueError:
        return False
    return True


def _gzip_ends(handle) -> bool:
    decoder = None
    try:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            while chunk:
                if decoder is None or decoder.eof:  # members one after another, as `cat a.gz b.gz` makes
                    decoder = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
                decoder.decompress(chunk, CHUNK)
                chunk = decoder.unused_data if decoder.eof else decoder.unconsumed_tail
    except zlib.error:
        return True  # not gzip after all: the reader says why
    return decoder is not None and decoder.eof


FORMAT = Format("jsonl", suffixes=(".jsonl", GZIPPED), read=read, plan=planned_by_reading(read),
                ends_whole=ends_whole)
