"""Expected training rows for real input files, computed by tests/reference.py from the raw rows.

Reads inputs with plain pyarrow/torch (not the project's reader) so the
end-to-end tests check the project's reader and adapter as well as its core.
"""
from __future__ import annotations

import math

import pyarrow.parquet as pq
import torch

from tests.reference import Batch, Row, reference_relabel


def raw_rows(path: str, reward_key=None):
    """(rows as dicts, prompt_group_sizes) of one input file."""
    if path.endswith(".pt"):
        dump = torch.load(path, weights_only=True)
        sizes = (dump.get("metadata") or {}).get("prompt_group_sizes")
        return dump["samples"], sizes
    return pq.read_table(path).to_pylist(), None


def trainable(sample) -> int:
    if sample.get("remove_sample"):
        return 0
    if sample.get("loss_mask") is not None:
        return int(sum(sample["loss_mask"]))
    return int(sample.get("response_length") or 0)


def reward_of(sample, reward_key):
    value = sample["reward"]
    return float(value[reward_key]) if reward_key else float(value)


def expected_outputs(paths: list[str], config, reward_key=None) -> dict[str, list]:
    """path -> list of (row position, RowResult), batches as docs/semantics.md defines them."""
    batches: dict[str, list] = {}
    sizes: dict[str, list | None] = {}
    for path in sorted(paths):
        samples, file_sizes = raw_rows(path)
        for position, sample in enumerate(samples):
            key = f"step={sample['step']}" if "step" in sample else f"file={path}"
            batches.setdefault(key, []).append((path, position, sample))
            sizes[key] = file_sizes
    out: dict[str, list] = {p: [] for p in paths}
    for key, members in batches.items():
        rows = [Row(reward=reward_of(s, reward_key), trainable=trainable(s), group_index=s.get("group_index"),
                    rollout_id=s.get("rollout_id"), index=s.get("index"),
                    problem="" if math.isfinite(reward_of(s, reward_key)) else "non-finite-reward")
                for _, _, s in members]
        [results] = reference_relabel([Batch(rows, sizes[key])], config)
        for (path, position, _), result in zip(members, results):
            out[path].append((position, result))
    return out
