"""Run one implementation as a child process and measure it from the parent.

Wall time: time.perf_counter() around Popen .. os.wait4. Peak RSS and CPU time:
the rusage os.wait4 returns for the child (ru_maxrss is in KiB on Linux and
covers the child's own waited-for children too). Public tools only; the
measuring parent is the small launcher process (bench/launcher.py).
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import sys

from bench import launcher

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH_DIR)
OUT_DIR = os.path.join(BENCH_DIR, "out")
RUNS_DIR = os.path.join(OUT_DIR, "runs")
LOG_DIR = os.path.join(OUT_DIR, "logs")


@dataclasses.dataclass(frozen=True)
class Impl:
    key: str
    label: str
    kind: str  # "pipeline" | "peer" | "floor"
    options: tuple[str, ...] = ()  # more relabel run options (the pipeline on another runner)

    def command(self, input_dir: str, output_dir: str) -> list[str]:
        if self.kind == "pipeline":
            return relabel_command() + ["run", "--input", input_dir, "--output", output_dir, *self.options]
        return [sys.executable, "-m", f"bench.peers.{self.key}", "--input", input_dir, "--output", output_dir]


# Run order inside a round (A B C D E).
IMPLS = {
    "pipeline": Impl("pipeline", "pipeline (relabel run)", "pipeline"),
    "duckdb_peer": Impl("duckdb_peer", "duckdb SQL", "peer"),
    "polars_peer": Impl("polars_peer", "polars", "peer"),
    "loop_peer": Impl("loop_peer", "python loop", "peer"),
    "floor": Impl("floor", "floor (pyarrow r+w)", "floor"),
    # the floor with the files split over one process per core: what two cores allow
    "floor_2core": Impl("floor_2core", "floor, one process per core", "floor"),
    # the same pipeline on Beam's Dask runner, a LocalCluster started and closed by the run (--peers dask)
    "pipeline_dask": Impl("pipeline_dask", "pipeline on Dask (LocalCluster)", "pipeline", ("--runner", "DaskRunner")),
}
ALIASES = {"pipeline": "pipeline", "duckdb": "duckdb_peer", "polars": "polars_peer", "loop": "loop_peer",
           "floor": "floor", "floor2": "floor_2core", "dask": "pipeline_dask"}
ONLY_WHEN_NAMED = ("pipeline_dask",)  # not in the default set: another runner, not a peer


def relabel_command() -> list[str]:
    script = os.path.join(os.path.dirname(sys.executable), "relabel")
    if os.path.exists(script):
        return [script]
    return [sys.executable, "-m", "rollout_relabel"]


@dataclasses.dataclass
class Measurement:
    wall_s: float
    cpu_s: float
    peak_rss_mb: float
    exit_code: int
    log: str
    started_at: float  # time.time() just before the process was started


def measure(command: list[str], log_path: str, env: dict | None = None) -> Measurement:
    """Run `command` (cwd = repository root), return wall time, CPU time, peak RSS and exit code.

    Through the small launcher process when `python -m bench` started one (see bench/launcher.py: a
    child forked from this big process would report this process's RSS as its own), else directly.
    """
    env = dict(os.environ, **(env or {}))
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    runner = launcher.get()
    if runner is not None:
        r = runner.run(command, ROOT, env, log_path)
    else:
        r = launcher.run_and_measure(command, ROOT, env, log_path)
    return Measurement(r["wall_s"], r["cpu_s"], r["peak_rss_mb"], r["exit_code"], log_path, r["started_at"])


def log_tail(path: str, lines: int = 25) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def fresh_dir(path: str) -> str:
    if os.path.exists(path):
        shutil.rmtree(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return path


def output_bytes(directory: str) -> int:
    return sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory)
               if f.startswith("part-") and f.endswith(".parquet"))


class RunFailed(RuntimeError):
    pass


def run_impl(impl: Impl, dataset: str, input_dir: str, tag: str) -> tuple[Measurement, str, int]:
    """One measured run into a fresh output directory; returns (measurement, output dir, output bytes)."""
    out = fresh_dir(os.path.join(RUNS_DIR, dataset, impl.key))
    m = measure(impl.command(input_dir, out), os.path.join(LOG_DIR, f"{dataset}-{impl.key}-{tag}.log"))
    if m.exit_code != 0:
        command = " ".join(impl.command(input_dir, out))
        raise RunFailed(f"{impl.label} on {dataset} exited with {m.exit_code} ({command}); "
                        f"log {m.log}:\n{log_tail(m.log)}")
    return m, out, output_bytes(out)
