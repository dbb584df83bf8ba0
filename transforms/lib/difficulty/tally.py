"""One prompt's counts over any number of units, merged in any order to the same result.

A Tally is one key's counts (prompt, and run or step under --by): units, passes, the exact sum of their
rewards, the runs it was seen in, its first and last step and one prompt value. The stage merges many
keys at once, column by column (tally_batch.py), the way Tally.merge merges one, and falls back on
Tally.merge for the keys whose rewards need the expansion below. Every merge is exact and commutative,
so the table does not depend on how a runner split the work:

- the reward sum is kept as non-overlapping float64 parts whose exact sum is the sum of every reward
  (Shewchuk's expansion arithmetic, "Adaptive Precision Floating-Point Arithmetic", 1997); the mean is
  that exact sum rounded once (math.fsum) and divided by the count;
- the prompt kept is the least of the prompts seen (text order), not the first one seen (one key may name
  several prompts under --prompt-key).
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pyarrow as pa


def grow(parts: list[float], value: float) -> list[float]:
    """`parts` (non-overlapping, increasing magnitude) with `value` added exactly, in place."""
    kept = 0
    for part in parts:
        if abs(value) < abs(part):
            value, part = part, value
        high = value + part
        low = part - (high - value)  # the rounding error of high, exactly
        if low:
            parts[kept] = low
            kept += 1
        value = high
    parts[kept:] = [value]
    return parts


class Tally:
    """The accumulator of one key. `runs_elsewhere` counts runs known only by number (rows of a table
    already written: their names are in its record, and a run is never counted twice)."""

    __slots__ = ("units", "passes", "reward_parts", "runs", "runs_elsewhere", "first_step", "last_step", "prompt")

    def __init__(self, units: int = 0, passes: int = 0, reward_parts=(), runs=(), runs_elsewhere: int = 0,
                 first_step: int | None = None, last_step: int | None = None, prompt: str | None = None):
        # callers pass Python ints and floats (a runner builds many: no conversions here)
        self.units, self.passes = units, passes
        self.reward_parts = list(reward_parts)
        self.runs = set(runs)
        self.runs_elsewhere = runs_elsewhere
        self.first_step, self.last_step = first_step, last_step
        self.prompt = prompt

    def merge(self, other: Tally) -> Tally:
        self.units += other.units
        self.passes += other.passes
        for part in other.reward_parts:
            grow(self.reward_parts, part)
        self.runs |= other.runs
        self.runs_elsewhere += other.runs_elsewhere
        self.first_step = _least(self.first_step, other.first_step, min)
        self.last_step = _least(self.last_step, other.last_step, max)
        if other.prompt is not None and (self.prompt is None or other.prompt < self.prompt):
            self.prompt = other.prompt
        return self

    @property
    def run_count(self) -> int:
        return len(self.runs) + self.runs_elsewhere

    @property
    def reward_sum(self) -> float:
        return math.fsum(self.reward_parts)

    def parts(self) -> list[float]:
        """The reward sum's parts, normalized (a pure function of the exact sum, whatever the merge order)."""
        return exact_parts(self.reward_parts)

    def state_args(self) -> tuple:
        """Its slots as plain values: Tally(*state_args()) is an equal Tally sharing nothing with it."""
        return (self.units, self.passes, tuple(self.reward_parts), tuple(sorted(self.runs)), self.runs_elsewhere,
                self.first_step, self.last_step, self.prompt)

    def __reduce__(self):  # pickled between workers: the slots as they are
        return (Tally, (self.units, self.passes, self.reward_parts, self.runs, self.runs_elsewhere,
                        self.first_step, self.last_step, self.prompt))

    def state(self) -> tuple:
        """What the table shows of it: equal states, equal rows."""
        return (self.units, self.passes, self.parts(), self.run_count, self.first_step, self.last_step, self.prompt)

    def __eq__(self, other):
        return isinstance(other, Tally) and self.state() == other.state()

    def __repr__(self):
        return (f"Tally(units={self.units}, passes={self.passes}, sum={self.reward_sum!r}, runs={self.run_count}, "
                f"steps={self.first_step}..{self.last_step})")


def exact_parts(parts: list[float]) -> list[float]:
    """The same exact sum as one canonical list: the correctly rounded sum, then what it leaves out (twice
    at most for any realistic run), so equal sums give equal lists."""
    remaining = list(parts)
    out: list[float] = []
    while any(remaining) and len(out) < 4:
        head = math.fsum(remaining)
        out.append(head)
        remaining = grow(remaining, -head)
    return out


def _least(a, b, pick):
    if a is None:
        return b
    if b is None:
        return a
    return pick(a, b)


# Rewards that are multiples of 2**-FINE and whose absolute sum stays below 2**(53 - FINE): any sum of
# them is exact in float64, in any order (the common case: 0/1 rewards, partial credit in halves).
FINE = 20


def exact_group_sums(codes: np.ndarray, rewards: np.ndarray, groups: int) -> list[list[float]]:
    """Each group's reward sum as exact parts: one vectorized sum when every sum is exact in float64, else
    the expansion added value by value."""
    sums = _fine_sums(codes, rewards, groups)
    if sums is not None:
        return [[float(s)] if s else [] for s in sums]
    out: list[list[float]] = [[] for _ in range(groups)]
    for code, value in zip(codes.tolist(), rewards.tolist()):
        grow(out[code], value)
    return out


def exact_group_parts(codes: np.ndarray, rewards: np.ndarray, groups: int) -> pa.ListArray:
    """exact_group_sums as one list<float64> array (built without a Python list a group when the sums
    are exact in float64)."""
    sums = _fine_sums(codes, rewards, groups)
    if sums is None:
        return pa.array(exact_group_sums(codes, rewards, groups), pa.list_(pa.float64()))
    nonzero = sums != 0
    offsets = np.zeros(groups + 1, dtype=np.int32)
    np.cumsum(nonzero, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(sums[nonzero]))


def _fine_sums(codes: np.ndarray, rewards: np.ndarray, groups: int) -> np.ndarray | None:
    """Each group's sum in float64 where all of them are exact (every reward a multiple of 2**-FINE, their
    absolute sum below 2**(53 - FINE)), else None."""
    scaled = rewards * float(2 ** FINE)
    if np.all(np.floor(scaled) == scaled) and float(np.abs(rewards).sum()) < 2.0 ** (53 - FINE):
        return np.bincount(codes, weights=rewards, minlength=groups)
    return None


def pass_at_k(units: int, passes: int, k: int) -> float | None:
    """The unbiased pass@k estimate 1 - C(n-c, k) / C(n, k) (n units, c passes), None where n < k.

    Computed in exact integers and rounded once (float(Fraction) rounds correctly): no cancellation, no
    overflow, the same value on every machine."""
    if units < k:
        return None
    fails = units - passes
    if fails < k:
        return 1.0
    total = math.comb(units, k)
    return float(Fraction(total - math.comb(fails, k), total))
