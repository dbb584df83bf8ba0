"""The cost of a Delta table output: `relabel run --output-format delta` against the folder output on one size.

    python -m bench.delta_output [--size M] [--rounds 3]

Each round runs the folder output and then the Delta output, each into a fresh
output, as separate processes (the same `relabel` the user runs, start-up
included), and takes each one's wall time; the figure is the ratio of the
medians. The target (issue 28): the Delta output costs at most TARGET times the
folder output's wall time on M. Exit 1 when the ratio is above it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

from bench import datasets as ds_lib
from bench.harness import LOG_DIR, RUNS_DIR, fresh_dir, log_tail, measure, relabel_command

TARGET = 1.1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="M", choices=sorted(ds_lib.DATASETS))
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    input_dir = ds_lib.ensure(ds_lib.DATASETS[args.size])
    os.makedirs(LOG_DIR, exist_ok=True)
    walls: dict[str, list[float]] = {"folder": [], "delta": []}
    for round_ in range(args.rounds):
        for kind, extra in (("folder", []), ("delta", ["--output-format", "delta"])):
            out = fresh_dir(os.path.join(RUNS_DIR, args.size, f"output-{kind}"))
            log = os.path.join(LOG_DIR, f"{args.size}-output-{kind}-{round_}.log")
            m = measure(relabel_command() + ["run", "--input", input_dir, "--output", out, *extra], log)
            if m.exit_code != 0:
                print(f"{kind} output failed (exit {m.exit_code}):\n{log_tail(log)}", file=sys.stderr)
                return 1
            walls[kind].append(m.wall_s)
            print(f"round {round_ + 1}: {kind:<6} {m.wall_s:7.2f} s wall, {m.cpu_s:7.2f} s CPU, "
                  f"peak RSS {m.peak_rss_mb:.0f} MB", flush=True)
    folder, delta = statistics.median(walls["folder"]), statistics.median(walls["delta"])
    ratio = delta / folder
    print(f"{args.size}: folder {folder:.2f} s, delta {delta:.2f} s (medians of {args.rounds}): "
          f"delta / folder = {ratio:.3f} (target <= {TARGET})")
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
