"""Micro-benchmark of the numeric core: core.advantages.relabel on one ~1M-row CoreInput.

The CoreInput is built in-process from a dataset's files with the pipeline's
own adapter (slim.extract_slim), every batch at once, as
relabel_batch builds it for one batch. Only the core call is timed: best of
`repeat` after one warm-up call, on numpy (the pipeline's CPU path) in one
call over all batches and in one call per batch (as the pipeline's DoFns
call it: ~10k rows at a time stay in cache, and small arrays reuse freed
memory instead of faulting fresh pages in), then the one-call form on
torch's CPU backend (the GPU path) with torch's default intra-op thread
count and with one thread. Then each estimator (grpo and those of version 2
of the contract) on numpy in one call, as `by_estimator` with its ratio to
grpo: gdpo reads two per-key values (the reward, and a seeded 0/1 second
key), remax a seeded 0/1 baseline per row. `grpo+off-policy` is grpo with version 3's staleness and
filters on (--max-staleness 1 over seeded versions 0..3, --keep-band 0.05:0.95 over a seeded 0/1 metric,
--uniform-tolerance 1e-6); its target: >= 0.8x grpo's rows/s. `grpo+off-policy+drop+exclude` adds
--stale-rows drop and --zero-mask-units exclude (units moved out of the statistics), reported beside it.
Prints one JSON line.

    python -m bench.core_micro DATASET_DIR [--repeat 5] [--device cuda] [--estimators grpo,gdpo]

On a GPU (torch) the input is moved to the device once (as the pipeline's DoFn does per batch, outside
this timing) and each timed call ends with torch.cuda.synchronize(); threads do not apply.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import fields, replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.datasets import input_files
from rollout_relabel.transforms.core.advantages import compute_advantages
from rollout_relabel.transforms.core.arrays import TORCH_CPU
from rollout_relabel.transforms.core.config import CoreConfig
from rollout_relabel.transforms.core.types import CoreInput
from rollout_relabel.transforms.lib.labeling.label_batch import core_input_from_slim
from rollout_relabel.transforms.lib.labeling.slim import extract_slim


def build_core_input(directory: str) -> CoreInput:
    """Every batch of the dataset in one CoreInput, built by the pipeline's own adapter."""
    by_batch: dict[str, list[pa.Table]] = {}
    for path in input_files(directory):  # sorted: (source, row) order inside each batch
        table = pq.read_table(path, columns=["step", "group_index", "index", "rollout_id", "reward",
                                             "response_length", "loss_mask", "remove_sample"])
        for key, slim in extract_slim(table, path, None):
            by_batch.setdefault(key, []).append(slim)
    keys = sorted(by_batch, key=lambda k: int(k.split("=", 1)[1]) if k.startswith("step=") else k)
    slims = [pa.concat_tables(by_batch[k]) for k in keys]
    slim = pa.concat_tables(slims).combine_chunks()
    batch = np.repeat(np.arange(len(slims)), [t.num_rows for t in slims])
    problem = slim.column("problem").to_numpy().astype(np.int64)
    return core_input_from_slim(slim, batch, [None] * len(slims), problem)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("directory")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--estimators", default=",".join(ESTIMATORS),
                        help="estimators timed one by one on numpy (comma-separated; empty: none)")
    args = parser.parse_args()
    if args.device != "cpu":
        return device_main(args)
    t0 = time.perf_counter()
    inp = build_core_input(args.directory)
    build_s = time.perf_counter() - t0
    config = CoreConfig()  # rollout-mainstream, grpo, std on
    runs = {"numpy": _best_of([inp], config, args.repeat),
            "numpy, one call per batch": _best_of(split_batches(inp), config, args.repeat)}
    import torch
    on_torch = inp.to(TORCH_CPU)
    default_threads = torch.get_num_threads()
    for threads in dict.fromkeys([default_threads, 1]):
        torch.set_num_threads(threads)
        runs[f"torch cpu, {threads} thread(s)"] = _best_of([on_torch], config, args.repeat)
    best = runs["numpy"]
    by_estimator = estimator_runs(inp, [e for e in args.estimators.split(",") if e], args.repeat)
    # the off-policy target also in the pipeline's shape: one call per batch
    per_batch = estimator_runs(inp, [e for e in args.estimators.split(",") if e in ("grpo", "grpo+off-policy")],
                               args.repeat, per_batch=True)
    print(json.dumps({
        "rows": inp.num_rows, "batches": inp.num_batches, "build_s": build_s, "times_s": best["times_s"],
        "best_s": best["best_s"], "rows_per_s": best["rows_per_s"], "by_backend": runs,
        "by_estimator": by_estimator, "by_estimator_per_batch": per_batch,
        "numpy": np.__version__, "torch": torch.__version__, "live_rows": best["live_rows"],
    }))


# grpo first: the others' ratio is to it
ESTIMATORS = ("grpo", "grpo_passk", "opo", "gpg", "remax", "gdpo", "grpo_loo", "grpo+off-policy",
              "grpo+off-policy+drop+exclude")
OFF_POLICY = {"grpo+off-policy": dict(max_staleness=1, keep_band="0.05:0.95", uniform_tolerance=1e-6),
              "grpo+off-policy+drop+exclude": dict(max_staleness=1, stale_rows="drop", zero_mask_units="exclude",
                                                   keep_band="0.05:0.95", uniform_tolerance=1e-6)}


def config_for(name: str) -> CoreConfig:
    if name in OFF_POLICY:
        return CoreConfig(**OFF_POLICY[name])
    return CoreConfig(estimator=name, reward_keys=("reward", "second") if name == "gdpo" else None)


def with_wider_inputs(inp: CoreInput) -> CoreInput:
    """The input plus what gdpo and remax read: per-key values (reward, seeded 0/1) and a seeded baseline."""
    rng = np.random.default_rng(16)
    second = rng.integers(0, 2, inp.num_rows).astype(np.float64)
    return replace(inp, reward_parts=np.stack([inp.reward, second]),
                   baseline=rng.integers(0, 2, inp.num_rows).astype(np.float64),
                   version=rng.integers(0, 4, inp.num_rows).astype(np.float64),
                   metric=rng.integers(0, 2, inp.num_rows).astype(np.float64))


def estimator_runs(inp: CoreInput, estimators, repeat, per_batch: bool = False) -> dict:
    """Each estimator on numpy, one call over all batches (per_batch: one call per batch, as the pipeline
    calls it); rows/s and the ratio to grpo's."""
    wider = [with_wider_inputs(inp)]
    if per_batch:
        wider = split_batches(wider[0])
    runs = {}
    for name in estimators:
        runs[name] = _best_of(wider, config_for(name), repeat)
        del runs[name]["times_s"]
    if "grpo" in runs:
        for run in runs.values():
            run["ratio_to_grpo"] = run["rows_per_s"] / runs["grpo"]["rows_per_s"]
            # the same on the thread's CPU time: steadier where other processes share the cores
            run["cpu_ratio_to_grpo"] = runs["grpo"]["best_cpu_s"] / run["best_cpu_s"]
    return runs


def split_batches(inp: CoreInput) -> list[CoreInput]:
    """One CoreInput per batch, as RelabelFileGroupFn hands the core one batch at a time."""
    bounds = np.searchsorted(inp.batch, np.arange(inp.num_batches + 1))
    per_row = [f.name for f in fields(CoreInput) if f.name not in ("batch", "num_batches", "prompt_group_sizes")
               and getattr(inp, f.name) is not None]
    return [CoreInput(batch=np.zeros(end - start, dtype=np.int64), num_batches=1, prompt_group_sizes=[sizes],
                      **{name: getattr(inp, name)[start:end].copy() for name in per_row})
            for start, end, sizes in zip(bounds[:-1], bounds[1:], inp.prompt_group_sizes)]


def _best_of(inputs: list[CoreInput], config, repeat) -> dict:
    """Best time of relabelling every input (one call each) after a warm-up."""
    for inp in inputs:
        compute_advantages(inp, config)
    times, cpu = [], []
    for _ in range(repeat):
        t, c = time.perf_counter(), time.thread_time()
        outs = [compute_advantages(inp, config) for inp in inputs]
        times.append(time.perf_counter() - t)
        cpu.append(time.thread_time() - c)
    rows = sum(inp.num_rows for inp in inputs)
    return {"times_s": times, "best_s": min(times), "best_cpu_s": min(cpu), "rows_per_s": rows / min(times),
            "calls": len(inputs),
            "live_rows": sum(int((out.problem == 0).sum()) for out in outs)}


def device_main(args) -> None:
    import torch
    inp = build_core_input(args.directory)
    on_device = inp.to(args.device)
    config = CoreConfig()
    compute_advantages(on_device, config)  # warm-up: kernels load and the caching allocator fills
    torch.cuda.synchronize()
    times = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        compute_advantages(on_device, config)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    best = min(times)
    wider = with_wider_inputs(inp).to(args.device)
    by_estimator = {}
    for name in [e for e in args.estimators.split(",") if e]:
        estimator_config = config_for(name)
        compute_advantages(wider, estimator_config)
        torch.cuda.synchronize()
        best_e = float("inf")
        for _ in range(args.repeat):
            t = time.perf_counter()
            compute_advantages(wider, estimator_config)
            torch.cuda.synchronize()
            best_e = min(best_e, time.perf_counter() - t)
        by_estimator[name] = {"best_s": best_e, "rows_per_s": inp.num_rows / best_e}
    print(json.dumps({"rows": inp.num_rows, "batches": inp.num_batches, "device": args.device,
                      "gpu": torch.cuda.get_device_name(), "times_s": times, "best_s": best,
                      "rows_per_s": inp.num_rows / best, "by_estimator": by_estimator, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
