"""Paired runs: variants of one workload timed round by round, interleaved, and compared by a ratio.

Each round runs every variant once, in alternating order (neither always runs on the warmer cache, unless a
bench asks for a fixed order), so that a shared machine's slow spells fall on both sides of a comparison.
The figure a bench gates on is the ratio of the variants' median times; the per-round ratios beside it say
how much the machine moved.

`interleave` is the loop for any timed callable (bench/agent_layouts.py times reads in-process);
`relabel_runs` runs `relabel run` variants as fresh processes on one input (turn_credit, rollout_correction,
delta_output).
"""
from __future__ import annotations

import json
import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench.harness import LOG_DIR, RunFailed, fresh_dir, log_tail, measure, relabel_command


def interleave(names: Sequence[str], rounds: int, run: Callable[[str, int], float],
               alternate: bool = True) -> dict[str, list[float]]:
    """run(name, round) -> seconds, for every name in every round; reversed order every other round when
    `alternate`. Returns each name's seconds, round by round."""
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(rounds):
        order = list(names) if not alternate or round_ % 2 == 0 else list(reversed(names))
        for name in order:
            times[name].append(run(name, round_))
    return times


def relabel_runs(input_dir: str, runs: dict[str, list[str]], rounds: int, output: Callable[[str], str],
                 log_prefix: str, check: Callable[[str, str], int | None] | None = None,
                 alternate: bool = True) -> dict[str, list[float]]:
    """Each round, `relabel run --input input_dir --output output(name) *runs[name]` for every name, a fresh
    process into a fresh output (start-up included); one line per run. `check(name, output)` looks at each
    first-round output before any further timing (it raises SystemExit on a bad output; a row count it
    returns is printed). Raises RunFailed, with the log's tail, when a run exits non-zero. Returns the wall
    times by name."""
    os.makedirs(LOG_DIR, exist_ok=True)
    width = max(6, *(len(name) for name in runs))

    def run(name: str, round_: int) -> float:
        out = fresh_dir(output(name))
        log = os.path.join(LOG_DIR, f"{log_prefix}-{name}-{round_}.log")
        m = measure(relabel_command() + ["run", "--input", input_dir, "--output", out, *runs[name]], log)
        if m.exit_code != 0:
            raise RunFailed(f"{name} failed (exit {m.exit_code}):\n{log_tail(log)}")
        rows = check(name, out) if check is not None and round_ == 0 else None
        print(f"round {round_ + 1}: {name:<{width}} {m.wall_s:7.2f} s wall, {m.cpu_s:7.2f} s CPU, "
              f"peak RSS {m.peak_rss_mb:.0f} MB" + (f", {rows} rows" if rows else ""), flush=True)
        return m.wall_s

    return interleave(list(runs), rounds, run, alternate)


def every_row_written(out: str) -> dict:
    """The manifest of a `relabel run` output in which every input row was written (a bench's generated data
    has no bad row); SystemExit naming the output otherwise. A `relabel_runs` check builds on it."""
    with open(os.path.join(out, "_manifest.json")) as handle:
        manifest = json.load(handle)
    counts = manifest["counts"]
    if counts["rows_out"] != counts["rows_in"] or counts["rows_dead"]:
        raise SystemExit(f"{out}: {counts['rows_out']} of {counts['rows_in']} rows written, "
                         f"{counts['rows_dead']} dead")
    return manifest


@dataclass(frozen=True)
class Ratio:
    """top against bottom: the ratio of their median times, and each round's own ratio."""
    top: float     # median seconds
    bottom: float
    per_round: tuple[float, ...]

    @classmethod
    def of(cls, times: dict[str, list[float]], top: str, bottom: str) -> Ratio:
        return cls(statistics.median(times[top]), statistics.median(times[bottom]),
                   tuple(a / b for a, b in zip(times[top], times[bottom])))

    @property
    def value(self) -> float:
        return self.top / self.bottom

    def spread(self) -> str:
        """The per-round ratios: their median and range."""
        return (f"per round {statistics.median(self.per_round):.2f}, {min(self.per_round):.2f}.."
                f"{max(self.per_round):.2f}")
