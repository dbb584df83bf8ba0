"""Fault injection for the crash-recovery tests: SIGKILL this process at a named point.

ROLLOUT_RELABEL_CRASH_AT="<point>:<file name>" kills the process when <point>
is reached for that output file name (points: before-rename, after-rename).
Unset in normal runs, where this is one dictionary lookup.
"""
import os
import signal

ENV = "ROLLOUT_RELABEL_CRASH_AT"


def crash_point(point: str, name: str) -> None:
    if os.environ.get(ENV) == f"{point}:{name}":
        os.kill(os.getpid(), signal.SIGKILL)
