"""A small launcher process that starts and measures the benchmarked processes.

Why: the kernel counts the pre-exec address space in a child's ru_maxrss (at
exec it records the old mm's high-water RSS, and a fork/vfork child's old mm
is a copy of, or the same as, its parent's). Forked from a benchmark parent
that has imported pyarrow and loaded tables (~300 MB), every child would report
at least that much. So `python -m bench` forks this launcher first, before any
heavy import (stdlib only here, ~10 MB), and asks it over a pipe to run each
command: it times the child with time.perf_counter() and reaps it with
os.wait4(), whose rusage gives the peak RSS (ru_maxrss, KiB) and CPU time.
"""
from __future__ import annotations

import json
import os
import subprocess
import time


def run_and_measure(command, cwd, env, log_path) -> dict:
    os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
    with open(log_path, "wb") as log:
        started_at = time.time()  # wall clock, for a probe in the child to compare with (bench/first_group.py)
        start = time.perf_counter()
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped by wait4: tell Popen
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_mb": usage.ru_maxrss / 1024.0,
            "exit_code": proc.returncode, "started_at": started_at}


class Launcher:
    def __init__(self):
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the launcher
            os.close(req_w)
            os.close(rep_r)
            code = 0
            try:
                with os.fdopen(req_r, "r") as requests, os.fdopen(rep_w, "w") as replies:
                    for line in requests:
                        req = json.loads(line)
                        try:
                            reply = run_and_measure(req["command"], req["cwd"], req["env"], req["log"])
                        except Exception as error:  # noqa: BLE001 - reported to the parent
                            reply = {"error": f"{type(error).__name__}: {error}"}
                        replies.write(json.dumps(reply) + "\n")
                        replies.flush()
            except BaseException:  # noqa: BLE001
                code = 1
            os._exit(code)
        os.close(req_r)
        os.close(rep_w)
        self.pid = pid
        self._requests = os.fdopen(req_w, "w")
        self._replies = os.fdopen(rep_r, "r")

    def run(self, command, cwd, env, log_path) -> dict:
        self._requests.write(json.dumps({"command": list(command), "cwd": cwd, "env": env, "log": log_path}) + "\n")
        self._requests.flush()
        line = self._replies.readline()
        if not line:
            raise RuntimeError("the benchmark launcher process died")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"launcher could not run {command}: {reply['error']}")
        return reply

    def close(self) -> None:
        try:
            self._requests.close()
            os.waitpid(self.pid, 0)
        except (OSError, ChildProcessError):
            pass


_LAUNCHER: Launcher | None = None


def start() -> Launcher:
    """Fork the launcher (call before importing anything heavy)."""
    global _LAUNCHER
    if _LAUNCHER is None:
        _LAUNCHER = Launcher()
    return _LAUNCHER


def get() -> Launcher | None:
    return _LAUNCHER
