"""Turn-level credit's cost: `relabel run --estimator gigpo` against `--estimator grpo` on the same rows.

    python -m bench.turn_credit [--size M] [--rounds 3]

gigpo (ROLL's GiGPO, docs/estimators.md "Turn-level credit") gives every row its own advantage: each rollout's
rows are its turns, in row order; the state key is `response_length` (a small integer: states repeat within
and across prompt groups, so ROLL's pooled state groups are real groups). Both runs are fresh processes on the
same dataset, start-up included; before any timing, both outputs are checked to hold every input row. The
figure is the ratio of the median wall times; the target (issue 35) is at most TARGET. Exit 1 when an output
is short or the ratio is above the target.
"""
from __future__ import annotations

import argparse
import os
import sys

from bench import datasets as ds_lib
from bench.harness import RUNS_DIR, RunFailed
from bench.paired import Ratio, every_row_written, relabel_runs

TARGET = 1.5
STATE_COLUMN = "response_length"
RUNS = {
    "grpo": ["--estimator", "grpo"],
    "gigpo": ["--estimator", "gigpo", "--state-column", STATE_COLUMN],
}


def check(out: str) -> int:
    """Every input row is written (the generated data has no bad row): rows out from the manifest."""
    return every_row_written(out)["counts"]["rows_in"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="M", choices=sorted(ds_lib.DATASETS))
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    input_dir = ds_lib.ensure(ds_lib.DATASETS[args.size])
    root = os.path.join(RUNS_DIR, "turn_credit", args.size)
    try:
        walls = relabel_runs(input_dir, RUNS, args.rounds, lambda name: os.path.join(root, name),
                             f"{args.size}-turn-credit", lambda name, out: check(out))
    except RunFailed as failed:
        print(failed, file=sys.stderr)
        return 1
    ratio = Ratio.of(walls, "gigpo", "grpo")
    print(f"{args.size}: gigpo (state column {STATE_COLUMN}) {ratio.top:.2f} s, grpo {ratio.bottom:.2f} s (medians of "
          f"{args.rounds}): ratio {ratio.value:.2f} ({ratio.spread()}; target <= {TARGET})")
    return 0 if ratio.value <= TARGET else 1

if __name__ == "__main__":
    sys.exit(main())
