"""Every failure the project raises on purpose, and the exit code each one means.

Exit codes come from these types, never from an exception's text. A worker
that stops a run on purpose (RunStopped) also commits a stop file in the
output directory (transforms/lib/output/output_dir.py), because runners deliver a
worker's exception to the driver as text; the driver reads the record back
as the same type.
"""
from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0             # every row written
    INTERNAL = 1       # a bug, an environment failure mid-run, or lost rows (nothing committed)
    USAGE = 2          # bad options or configuration: nothing written
    DEAD_LETTERS = 3   # finished with dead letters, or stopped by --fail-fast / --max-dead-fraction
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT), as shells report it


class UsageError(ValueError):
    """Bad options or configuration, found before anything is written."""
    exit_code = ExitCode.USAGE


class MissingInput(UsageError):
    """An --input path (not a glob) that names nothing: not there (yet)."""


class CommitConflict(UsageError):
    """A Delta commit lost to a concurrent one that replaced the same run first: nothing of this one is
    committed (the table shows the winner's version); rerunning replaces it."""


class BadFile(Exception):
    """A whole input file cannot be used (unreadable, or its rows cannot be put in batches)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


class RunStopped(RuntimeError):
    """A worker stopped the run on purpose. Subclasses say what the driver does with the outputs."""
    exit_code = ExitCode.INTERNAL
    discard_outputs = False  # whether the part files written so far are removed


class FailFast(RunStopped):
    """--fail-fast: the first bad input stops the run; no output files are left."""
    exit_code = ExitCode.DEAD_LETTERS
    discard_outputs = True


class TooManyDeadRows(RunStopped):
    """--max-dead-fraction exceeded: the run is not committed."""
    exit_code = ExitCode.DEAD_LETTERS
    discard_outputs = True


class InputChanged(RunStopped):
    """An input's size or mtime changed between planning and reading: its batch would be normalized over
    rows the plan never saw. Nothing is committed; a rerun plans again."""


class AccountingError(RunStopped):
    """rows in != rows out + dead + filtered: something was lost; such a run is never committed."""


STOPS = {cls.__name__: cls for cls in (FailFast, TooManyDeadRows, InputChanged, AccountingError)}
