"""What the reward hook adds to a training step: rollout_relabel.hooks.slime.post_process_rewards on N samples.

Builds one step of N Sample-like objects (the attributes slime / miles Sample has, slots, no
instrumentation) with `--tokens`-token loss masks, 8 rollouts per prompt, a quarter of the rollouts
stored as two rows, then times, best of `--repeat` after a warm-up:

  hook         the whole hook call (reading the samples, the numeric core, the returned lists)
  read         of which rollout_relabel.transforms.lib.hooks.sample_core.rows_from_samples (one sum() over each mask)
  core         of which the numeric core on the rows read, and the two lists returned
  trainer sum  what the trainer does anyway: a plain-Python sum() over every mask, accumulated per
               rollout id (slime's and miles' rollout_mask_sums), for comparison

    python -m bench.hook_timing [--samples 4096,65536] [--tokens 1024] [--repeat 5]

Prints a table and one JSON line per size. The machine may be shared: compare the ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import time

from rollout_relabel.hooks import config_from, slime
from rollout_relabel.transforms.core.advantages import compute_advantages
from rollout_relabel.transforms.lib.hooks.sample_core import rows_from_samples


class Sample:
    __slots__ = ("group_index", "index", "rollout_id", "reward", "loss_mask", "response_length", "remove_sample",
                 "status", "metadata")

    def __init__(self, **fields):
        for name in self.__slots__:
            setattr(self, name, fields.get(name))

    def get_reward_value(self, args):
        return self.reward if not args.reward_key else self.reward[args.reward_key]


class Args:
    advantage_estimator = "grpo"
    rewards_normalization = True
    grpo_std_normalization = True
    n_samples_per_prompt = 8
    rollout_batch_size = None
    reward_key = None


def make_step(n: int, tokens: int, seed: int = 0) -> list[Sample]:
    rng = random.Random(seed)
    ones, tool = [1] * tokens, [1] * (tokens // 2) + [0] * (tokens // 8) + [1] * (tokens - tokens // 2 - tokens // 8)
    samples, rollout = [], 0
    while len(samples) < n:
        prompt = rollout // 8
        rows = 2 if rng.random() < 0.25 else 1
        reward = float(rng.random() < 0.5)
        for _ in range(min(rows, n - len(samples))):
            samples.append(Sample(group_index=prompt, index=len(samples), rollout_id=rollout, reward=reward,
                                  loss_mask=list(tool if rng.random() < 0.3 else ones), response_length=tokens,
                                  remove_sample=False, status="completed", metadata={}))
        rollout += 1
    return samples


def trainer_mask_sums(samples) -> list[int]:
    """The trainer's own pass: one plain-Python sum per mask, totals per rollout id."""
    loss_masks = [s.loss_mask for s in samples]
    rollout_ids = [s.rollout_id for s in samples]
    sums = [sum(m) for m in loss_masks]
    totals: dict[int, int] = {}
    for rid, total in zip(rollout_ids, sums):
        totals[rid] = totals.get(rid, 0) + total
    return [totals[rid] for rid in rollout_ids]


def best(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", default="4096,65536")
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=5)
    options = parser.parse_args()
    args = Args()
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores, {options.tokens}-token masks, "
          f"best of {options.repeat}")
    print(f"{'samples':>8} {'hook ms':>9} {'read ms':>9} {'core ms':>9} {'trainer sum ms':>15} {'hook/sum':>9}")
    config = config_from(args)
    for n in (int(x) for x in options.samples.split(",")):
        samples = make_step(n, options.tokens)
        rows = rows_from_samples(samples)

        def core(samples=samples, rows=rows):
            out = compute_advantages(rows.core, config)
            return out.advantage.tolist(), [s.get_reward_value(args) for s in samples]

        hook = best(lambda samples=samples: slime.post_process_rewards(args, samples), options.repeat)
        read = best(lambda samples=samples: rows_from_samples(samples), options.repeat)
        core_time = best(core, options.repeat)
        trainer = best(lambda samples=samples: trainer_mask_sums(samples), options.repeat)
        print(f"{n:>8} {hook * 1e3:>9.1f} {read * 1e3:>9.1f} {core_time * 1e3:>9.1f} {trainer * 1e3:>15.1f} "
              f"{hook / trainer:>9.2f}")
        print(json.dumps({"samples": n, "tokens": options.tokens, "hook_s": hook, "read_s": read,
                          "core_s": core_time, "trainer_mask_sums_s": trainer}))
        del samples


if __name__ == "__main__":
    main()
