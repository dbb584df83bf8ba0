"""`mem://`: an in-memory object store registered with Beam's FileSystems, for tests.

Beam 2.77 ships no in-memory filesystem. This one behaves like gs:// or s3://
(flat keys, no directories, rename = copy + delete), so a pipeline that works
over it uses no local-only path handling. Importing this module registers the
scheme (Beam finds FileSystem subclasses by their scheme()).
"""
from __future__ import annotations

import io
import threading
import time

from apache_beam.io.filesystem import BeamIOError, CompressedFile, CompressionTypes, FileMetadata, FileSystem


class _Store:
    """Process-wide object store: Beam builds a new FileSystem object for every call."""
    objects: dict[str, tuple[bytes, float]] = {}
    lock = threading.Lock()


class _Writer(io.BytesIO):
    def __init__(self, path: str):
        super().__init__()
        self._path = path

    def close(self):
        if not self.closed:
            with _Store.lock:
                _Store.objects[self._path] = (self.getvalue(), time.time())
        super().close()


class MemoryFileSystem(FileSystem):
    @classmethod
    def scheme(cls):
        return "mem"

    def join(self, basepath, *paths):
        return "/".join([basepath.rstrip("/")] + [p.strip("/") for p in paths])

    def split(self, path):
        head, _, tail = path.rpartition("/")
        return head, tail

    def mkdirs(self, path):
        pass

    def has_dirs(self):
        return False

    def _list(self, dir_or_prefix):
        with _Store.lock:
            items = sorted(_Store.objects.items())
        for path, (data, mtime) in items:
            if path.startswith(dir_or_prefix):
                yield FileMetadata(path, len(data), mtime)

    def create(self, path, mime_type="application/octet-stream", compression_type=CompressionTypes.AUTO):
        return self._wrap(_Writer(path), path, compression_type)

    def open(self, path, mime_type="application/octet-stream", compression_type=CompressionTypes.AUTO):
        with _Store.lock:
            if path not in _Store.objects:
                raise BeamIOError(f"mem: no such object {path}")
            data = _Store.objects[path][0]
        return self._wrap(io.BytesIO(data), path, compression_type)

    def copy(self, source_file_names, destination_file_names):
        with _Store.lock:
            for source, destination in zip(source_file_names, destination_file_names):
                _Store.objects[destination] = (_Store.objects[source][0], time.time())

    def rename(self, source_file_names, destination_file_names):
        missing = {s: KeyError(s) for s in source_file_names if s not in _Store.objects}
        if missing:
            raise BeamIOError("mem: rename of missing objects", missing)
        with _Store.lock:
            for source, destination in zip(source_file_names, destination_file_names):
                _Store.objects[destination] = _Store.objects.pop(source)

    def exists(self, path):
        return path in _Store.objects

    def size(self, path):
        return len(_Store.objects[path][0])

    def last_updated(self, path):
        return _Store.objects[path][1]

    def checksum(self, path):
        return str(hash(_Store.objects[path][0]))

    def metadata(self, path):
        data, mtime = _Store.objects[path]
        return FileMetadata(path, len(data), mtime)

    def delete(self, paths):
        with _Store.lock:
            for path in paths:
                prefix = path.rstrip("/") + "/"
                for key in [k for k in _Store.objects if k == path or k.startswith(prefix)]:
                    del _Store.objects[key]

    @staticmethod
    def _wrap(raw, path, compression_type):
        if compression_type == CompressionTypes.AUTO:  # as Beam's FileSystem decides it, from the name
            compression_type = CompressionTypes.detect_compression_type(path)
        if compression_type == CompressionTypes.UNCOMPRESSED:
            return raw
        return CompressedFile(raw, compression_type=compression_type)


def clear(prefix: str = "mem://") -> None:
    with _Store.lock:
        for key in [k for k in _Store.objects if k.startswith(prefix)]:
            del _Store.objects[key]


def put(path: str, data: bytes) -> None:
    with _Store.lock:
        _Store.objects[path] = (data, time.time())


def get(path: str) -> bytes:
    return _Store.objects[path][0]


def keys(prefix: str = "mem://") -> list[str]:
    return sorted(k for k in _Store.objects if k.startswith(prefix))
