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
import sys

from bench import datasets as ds_lib
from bench.harness import RUNS_DIR, RunFailed
from bench.paired import Ratio, relabel_runs

TARGET = 1.1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="M", choices=sorted(ds_lib.DATASETS))
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    input_dir = ds_lib.ensure(ds_lib.DATASETS[args.size])
    runs = {"folder": [], "delta": ["--output-format", "delta"]}
    try:  # the folder output first in every round, as this bench always ran them
        walls = relabel_runs(input_dir, runs, args.rounds,
                             lambda kind: os.path.join(RUNS_DIR, args.size, f"output-{kind}"),
                             f"{args.size}-output", alternate=False)
    except RunFailed as failed:
        print(failed, file=sys.stderr)
        return 1
    ratio = Ratio.of(walls, "delta", "folder")
    print(f"{args.size}: folder {ratio.bottom:.2f} s, delta {ratio.top:.2f} s (medians of {args.rounds}): "
          f"delta / folder = {ratio.value:.3f} ({ratio.spread()}; target <= {TARGET})")
    return 0 if ratio.value <= TARGET else 1

if __name__ == "__main__":
    sys.exit(main())
