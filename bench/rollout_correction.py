"""Rollout correction's cost: `relabel run --rollout-correction PRESET` against the same run without it.

    python -m bench.rollout_correction [--size C] [--rounds 3] [--preset decoupled_k3_rs_token_tis]
    python -m bench.rollout_correction --rows 2000 --rounds 1      # a quick look at a tenth of C's rows

The rows carry ~1k-token loss masks and both logprob streams (dataset C: T's rows with `old_log_probs`
beside `rollout_log_probs`). With the correction each batch's written rows also carry their two streams
through slim extraction, the per-token weights, rejection and metrics are computed, and `is_weights` is
written. Both runs are fresh processes on the same data, start-up included; before any timing both
outputs are checked to hold every input row, and the corrected one to have a metrics entry per batch. The
figure is the ratio of the median wall times; the target (issue 36) is at most TARGET. Exit 1 when an
output is short or the ratio is above the target.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from bench import datasets as ds_lib
from bench.harness import RUNS_DIR, RunFailed
from bench.paired import Ratio, every_row_written, relabel_runs
from rollout_relabel.pipeline.generate import spec_for_rows

TARGET = 1.3


def check(out: str, corrected: bool) -> int:
    """Every input row is written (the generated data has no bad row); with the correction, each batch has
    its metrics."""
    manifest = every_row_written(out)
    counts = manifest["counts"]
    if corrected:
        batches = manifest["rollout_correction"]["batches"]
        if len(batches) != counts["batches"] or any(b["metrics"] is None for b in batches.values()):
            raise SystemExit(f"{out}: {len(batches)} batches with correction metrics of {counts['batches']}")
    return counts["rows_in"]


def dataset(size: str, rows: int | None) -> ds_lib.Dataset:
    base = ds_lib.DATASETS[size]
    if rows is None:
        return base
    spec = spec_for_rows(rows, **{k: v for k, v in dataclasses.asdict(base.spec).items()
                                  if k not in ("prompts_per_step",)})
    return dataclasses.replace(base, name=f"{size}-{rows}", spec=spec)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="C", choices=sorted(ds_lib.DATASETS))
    parser.add_argument("--rows", type=int, default=None, help="fewer rows than the dataset's (a quick look)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--preset", default="decoupled_k3_rs_token_tis")
    args = parser.parse_args(argv)
    ds = dataset(args.size, args.rows)
    if not ds.spec.old_logprobs:
        parser.error(f"dataset {args.size} has no old logprobs: use C")
    input_dir = ds_lib.ensure(ds)
    root = os.path.join(RUNS_DIR, "rollout_correction", ds.name)
    runs = {"plain": [], "corrected": ["--rollout-correction", args.preset]}
    try:
        walls = relabel_runs(input_dir, runs, args.rounds, lambda name: os.path.join(root, name),
                             f"{ds.name}-rollout-correction", lambda name, out: check(out, name == "corrected"))
    except RunFailed as failed:
        print(failed, file=sys.stderr)
        return 1
    ratio = Ratio.of(walls, "corrected", "plain")
    print(f"{ds.name}: --rollout-correction {args.preset} {ratio.top:.2f} s, without {ratio.bottom:.2f} s (medians "
          f"of {args.rounds}): ratio {ratio.value:.2f} ({ratio.spread()}; target <= {TARGET})")
    return 0 if ratio.value <= TARGET else 1

if __name__ == "__main__":
    sys.exit(main())
