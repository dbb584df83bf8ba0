"""Fault injection for the recovery tests: kill, fail or pause this process at a named point.

Each variable names "<point>:<output file name>" (points: before-rename, after-rename; and
before-commit:<run name>, a Delta run whose part files are all written, before its commit):
- ROLLOUT_RELABEL_CRASH_AT: SIGKILL there (a crashed worker);
- ROLLOUT_RELABEL_FAIL_AT: raise OSError(ENOSPC) there (a full disk);
- ROLLOUT_RELABEL_PAUSE_AT: "<point>:<name>:<seconds>", sleep there (a slow run, for concurrency tests).
Unset in normal runs, where this is three dictionary lookups.
"""
import errno
import os
import signal
import time

ENV = "ROLLOUT_RELABEL_CRASH_AT"
FAIL_ENV = "ROLLOUT_RELABEL_FAIL_AT"
PAUSE_ENV = "ROLLOUT_RELABEL_PAUSE_AT"


def crash_point(point: str, name: str) -> None:
    here = f"{point}:{name}"
    if os.environ.get(ENV) == here:
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get(FAIL_ENV) == here:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), name)
    pause = os.environ.get(PAUSE_ENV, "")
    if pause.rsplit(":", 1)[0] == here:
        time.sleep(float(pause.rsplit(":", 1)[1]))
