"""What in-process Beam workers print while a pipeline runs goes to a log file, not the user's terminal.

Beam's SDK worker prints a failing bundle's traceback straight to stderr (besides raising it), from its
own threads; the CLI reports a failure in one line instead. The log file is kept when it holds anything,
and a failure names it. RELABEL_TRACEBACK=1 leaves stderr alone (and the CLI shows tracebacks).
"""
from __future__ import annotations

import os
import sys
import tempfile
from contextlib import contextmanager

TRACEBACK_ENV = "RELABEL_TRACEBACK"


@contextmanager
def logged():
    if os.environ.get(TRACEBACK_ENV):
        yield
        return
    handle = tempfile.NamedTemporaryFile("w", prefix="relabel-workers-", suffix=".log", delete=False)
    previous, sys.stderr = sys.stderr, handle
    try:
        yield
    except BaseException as error:
        handle.flush()
        if handle.tell():
            error.add_note(f"workers' output: {handle.name}")
        raise
    finally:
        sys.stderr = previous
        handle.close()
        if os.path.getsize(handle.name) == 0:
            os.unlink(handle.name)
