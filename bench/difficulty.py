"""`relabel difficulty` against a polars group-by of the same rows: one dataset cut into runs.

    python -m bench.difficulty [--size M] [--runs 10] [--rounds 3]

The dataset's files (in step order) are split into --runs runs of consecutive files (folders of
symbolic links under bench/out/runs/difficulty/), and both implementations build the pass-rate table
over all of them, each a fresh process (start-up included, the project's modules byte-compiled first as
installing does): `relabel difficulty --input RUN...` and bench/peers/difficulty_polars.py. Before any
timing, every prompt's rollouts, passes and runs are checked equal in both tables. The figure is the
ratio of the median wall times; the target (issue 37) is at most TARGET. Exit 1 when a table differs or
the ratio is above the target.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import pyarrow.parquet as pq

from bench import datasets as ds_lib
from bench.harness import LOG_DIR, RUNS_DIR, fresh_dir, log_tail, measure, relabel_command
from bench.main import compile_project

TARGET = 2.0
COMPARED = ("rollouts", "passes", "runs", "first_step", "last_step")


def split_runs(input_dir: str, runs: int, root: str) -> list[str]:
    """`runs` folders of consecutive files of the dataset (links, nothing copied)."""
    files = ds_lib.input_files(input_dir)
    if len(files) < runs:
        raise SystemExit(f"{input_dir} has {len(files)} files: fewer than --runs {runs}")
    fresh_dir(root)
    folders = []
    for r in range(runs):
        folder = os.path.join(root, f"run-{r:02d}")
        os.makedirs(folder)
        for path in files[r * len(files) // runs:(r + 1) * len(files) // runs]:
            os.symlink(path, os.path.join(folder, os.path.basename(path)))
        folders.append(folder)
    return folders


def commands(runs: list[str], out: str) -> dict[str, tuple[list[str], str]]:
    return {
        "pipeline": (relabel_command() + ["difficulty", "--input", *runs, "--output", os.path.join(out, "pipeline")],
                     os.path.join(out, "pipeline", "part-00000.parquet")),
        "polars": ([sys.executable, "-m", "bench.peers.difficulty_polars", "--output", os.path.join(out, "polars"),
                    "--input", *runs], os.path.join(out, "polars", "table.parquet")),
    }


def check(tables: dict[str, str]) -> None:
    """Both tables hold the same prompts with the same counts (mean rewards within 1e-12)."""
    ours, theirs = (pq.read_table(tables[k]).to_pylist() for k in ("pipeline", "polars"))
    theirs_by_key = {row["prompt_key"]: row for row in theirs}
    if len(ours) != len(theirs) or set(theirs_by_key) != {row["prompt_key"] for row in ours}:
        raise SystemExit(f"the tables hold different prompts: {len(ours)} rows against {len(theirs)}")
    for row in ours:
        other = theirs_by_key[row["prompt_key"]]
        differ = [c for c in COMPARED if row[c] != other[c]]
        if differ or abs(row["mean_reward"] - other["mean_reward"]) > 1e-12:
            raise SystemExit(f"prompt {row['prompt_key']}: {differ or ['mean_reward']} differ: {row} != {other}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="M", choices=sorted(ds_lib.DATASETS))
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    compile_project()  # as `make bench` does first: start-up is timed as an installed package's
    input_dir = ds_lib.ensure(ds_lib.DATASETS[args.size])
    root = os.path.join(RUNS_DIR, "difficulty", args.size)
    runs = split_runs(input_dir, args.runs, os.path.join(root, "runs"))
    os.makedirs(LOG_DIR, exist_ok=True)
    walls: dict[str, list[float]] = {"pipeline": [], "polars": []}
    for round_ in range(args.rounds):
        out = fresh_dir(os.path.join(root, "out"))
        outputs = {}
        for kind, (command, table) in commands(runs, out).items():
            log = os.path.join(LOG_DIR, f"{args.size}-difficulty-{kind}-{round_}.log")
            m = measure(command, log)
            if m.exit_code != 0:
                print(f"{kind} failed (exit {m.exit_code}):\n{log_tail(log)}", file=sys.stderr)
                return 1
            walls[kind].append(m.wall_s)
            outputs[kind] = table
            print(f"round {round_ + 1}: {kind:<8} {m.wall_s:7.2f} s wall, {m.cpu_s:7.2f} s CPU, "
                  f"peak RSS {m.peak_rss_mb:.0f} MB", flush=True)
        if round_ == 0:
            check(outputs)
    ours, theirs = statistics.median(walls["pipeline"]), statistics.median(walls["polars"])
    ratio = ours / theirs
    print(f"{args.size} as {args.runs} runs: relabel difficulty {ours:.2f} s, polars {theirs:.2f} s (medians of "
          f"{args.rounds}): ratio {ratio:.2f} (target <= {TARGET})")
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
