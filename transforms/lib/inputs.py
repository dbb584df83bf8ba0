"""Expand --input paths (files, directories, globs) into files and their output names."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from transforms.lib import filesystem
from transforms.lib.errors import MissingInput, UsageError
from transforms.lib.readers import PARQUET_SUFFIXES, PT_SUFFIXES

GLOB_CHARS = re.compile(r"[*?\[]")
SAFE = re.compile(r"[^A-Za-z0-9._=-]+")


@dataclass(frozen=True)
class InputFile:
    path: str
    output: str          # part-<stem>.parquet, unique, never a path
    size: int
    mtime: float

    def record(self) -> dict:
        return {"path": self.path, "output": self.output, "size": self.size, "mtime": self.mtime}


def expand_inputs(inputs, output_dir: str) -> list[InputFile]:
    found: dict[str, tuple[str, object]] = {}
    for spec in inputs:
        root, pattern = _root_and_pattern(spec)
        matched = filesystem.match(pattern)
        if not matched and not GLOB_CHARS.search(spec):
            raise MissingInput(f"--input {spec}: no such file or directory")
        for meta in matched:
            path = meta.path
            if _is_rollout_file(path) and not _inside(path, output_dir) and path not in found:
                found[path] = (root, meta)
    files, owners = [], {}
    for path in sorted(found):
        root, meta = found[path]
        name = output_name(path, root)
        if name in owners:
            raise UsageError(f"inputs {owners[name]} and {path} would both write {name}; "
                             "give them separate --input roots or rename one")
        owners[name] = path
        files.append(InputFile(path, name, int(meta.size_in_bytes), float(meta.last_updated_in_seconds)))
    return files


def output_name(path: str, root: str) -> str:
    """part-<path relative to its input root, extension dropped>.parquet, flattened and sanitized."""
    relative = path[len(root):].lstrip("/\\") if path.startswith(root) else os.path.basename(path)
    stem = os.path.splitext(relative)[0]
    stem = "__".join(SAFE.sub("_", part) for part in re.split(r"[/\\]+", stem) if part not in ("", ".", ".."))
    return f"part-{stem or 'input'}.parquet"


def _root_and_pattern(spec: str):
    if GLOB_CHARS.search(spec):
        prefix = GLOB_CHARS.split(spec, maxsplit=1)[0]
        root = prefix if prefix.endswith("/") else prefix.rsplit("/", 1)[0] + "/"
        return root, spec
    tree = spec.rstrip("/") + "/"
    if spec.endswith("/") or filesystem.match(tree + "**"):
        # object stores have no directories: a path is one when something lies under it
        return tree, tree + "**"
    return spec.rsplit("/", 1)[0] + "/" if "/" in spec else "", spec


def _is_rollout_file(path: str) -> bool:
    name = path.replace("\\", "/").rsplit("/", 1)[-1]
    return not name.startswith((".", "_")) and name.lower().endswith(PT_SUFFIXES + PARQUET_SUFFIXES)


def _inside(path: str, directory: str) -> bool:
    if "://" not in directory:
        return os.path.abspath(path).startswith(os.path.abspath(directory).rstrip("/") + "/")
    return path.startswith(directory.rstrip("/") + "/")
