"""The floors for `.pt` dumps: torch.load + group-index GRPO + pa.Table.from_pylist + Parquet, per dump.

    python -m bench.peers.pt_floor --input DIR --output DIR [--unsafe] [--processes N]

`--unsafe`: torch.load(weights_only=False) (the C unpickler, which runs whatever the file asks: a
bound, never a way to read untrusted dumps); else weights_only=True, torch's safe loader, whose
unpickler is written in Python. `--processes N`: the dumps split over N processes (every N-th file to
each, the split a static partitioner makes). Group-index GRPO as docs/semantics.md gives it: groups
by `group_index`, r - mean, / (std + 1e-6) (ddof 1) in groups of two or more rows, 0 in a one-row group.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os

# imported before the processes fork, so that the two-process floor pays for the imports once
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

STD_EPS = 1e-6


def _relabel(job: tuple[str, str, bool]) -> None:
    path, output, unsafe = job
    dump = torch.load(path, map_location="cpu", weights_only=not unsafe)
    samples = dump["samples"]
    rewards = np.array([float(s["reward"]) for s in samples])
    groups = np.array([s["group_index"] for s in samples])
    advantage = np.zeros(len(samples))
    keys, inverse, counts = np.unique(groups, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, rewards)
    mean = sums / counts
    centred = rewards - mean[inverse]
    var = np.bincount(inverse, centred ** 2) / np.maximum(counts - 1, 1)
    many = counts[inverse] > 1
    advantage[many] = centred[many] / (np.sqrt(var)[inverse][many] + STD_EPS)
    rows = [dict(s, advantage=float(a)) for s, a in zip(samples, advantage)]
    table = pa.Table.from_pylist([{k: (v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in r.items()}
                                  for r in rows])
    # a field that is always an empty dict (slime's apply_chat_template_kwargs) is a struct with no
    # fields, which Parquet cannot hold: the pipeline stores it as JSON text, the floor as "{}"
    for position, field in enumerate(table.schema):
        if pa.types.is_struct(field.type) and field.type.num_fields == 0:
            table = table.set_column(position, field.name, pa.array(["{}"] * table.num_rows))
    pq.write_table(table, os.path.join(output, f"part-{os.path.splitext(os.path.basename(path))[0]}.parquet"),
                   compression="zstd")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--unsafe", action="store_true")
    parser.add_argument("--processes", type=int, default=1)
    args = parser.parse_args()
    os.makedirs(args.output, exist_ok=True)
    files = sorted(os.path.join(args.input, n) for n in os.listdir(args.input) if n.endswith(".pt"))
    jobs = [(path, args.output, args.unsafe) for path in files]
    if args.processes <= 1:
        for job in jobs:
            _relabel(job)
        return
    with multiprocessing.get_context("fork").Pool(args.processes) as pool:
        pool.map(_relabel, jobs, chunksize=max(1, len(jobs) // args.processes))


if __name__ == "__main__":
    main()
