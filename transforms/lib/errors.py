"""Every failure the project raises on purpose, and the exit code each one means.

Exit codes come from these types, never from an exception's text. A worker
that stops a run on purpose (RunStopped) also commits a stop file in the
output directory (transforms/lib/output/output_dir.py), because runners deliver a
worker's exception to the driver as text; the driver reads the record back
as the same type.
"""
from __future__ import annotations

import re
import unicodedata
from enum import IntEnum

# a terminal escape sequence (CSI: ESC [ parameters final byte, or a two-character ESC sequence)
_ESCAPE = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|[@-Z\\-_])")


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


class NotOurOutput(UsageError):
    """A file under one of the tool's names in an output directory that the tool did not write (another
    tool's, damaged): refused unless --overwrite, which replaces it."""


def printable(message: str) -> str:
    """A message as plain text: terminal escapes (torch colours its errors) removed, other control
    characters (line breaks too) as spaces, so that a record or a terminal shows only the words."""
    if message.isprintable():  # the common case, checked in C
        return message
    text = _ESCAPE.sub("", message)
    return "".join(" " if unicodedata.category(c) == "Cc" else c for c in text)


class DamagedOutput(UsageError):
    """A file the tool wrote is damaged (truncated, rewritten by hand): the command that writes it must run
    again before its output can be read."""


class CommitConflict(UsageError):
    """A Delta commit lost to a concurrent one that replaced the same run first: nothing of this one is
    committed (the table shows the winner's version); rerunning replaces it."""


class BadFile(Exception):
    """A whole input file cannot be used (unreadable, or its rows cannot be put in batches)."""

    def __init__(self, reason: str, message: str):
        message = printable(message)
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
