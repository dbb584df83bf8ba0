"""Per-sample Python loop peer, in the style of RL frameworks' in-process code.

Rows become Python dicts (one per sample) and plain loops do the rest:
rollout-mainstream, grpo, std normalization on, statistics in float64.
Pass 1 reads the slim columns of every file as dicts and computes each row's
training fields; pass 2 reads each file's full rows as dicts, updates them and
writes part-<stem>.parquet (zstd, the floor's writer options).
"""
from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.parquet as pq

from bench.peers.common import STD_EPS, input_files, output_path, parquet_write_options, parse_args

SLIM_COLUMNS = ["step", "group_index", "index", "rollout_id", "reward", "response_length", "loss_mask",
                "remove_sample"]
ADDED_FIELDS = [
    pa.field("raw_reward", pa.float32()),
    pa.field("advantage", pa.float32()),
    pa.field("mainstream", pa.bool_()),
    pa.field("rollout_key", pa.int64()),
    pa.field("prompt_group", pa.int64()),
    pa.field("truncated", pa.bool_()),
    pa.field("rollout_mask_sum", pa.int64()),
]


def trainable_tokens(sample: dict) -> int:
    if sample.get("remove_sample"):
        return 0
    if sample.get("loss_mask") is not None:
        return sum(sample["loss_mask"])
    length = sample.get("response_length")
    return max(length if length is not None else 0, 0)


def group_advantages(rewards: list[float]) -> list[float]:
    k = len(rewards)
    if k >= 2 and all(r == rewards[0] for r in rewards):
        return [0.0] * k
    mean = sum(rewards) / k
    centred = [r - mean for r in rewards]
    if k > 1:
        std = math.sqrt(sum(c * c for c in centred) / (k - 1))
        if std > 0:
            return [c / (std + STD_EPS) for c in centred]
    return centred


def compute(files: list[str]) -> dict[str, list[dict]]:
    """source -> per-row training fields, in row order."""
    batches: dict[int, list[tuple[str, int, dict]]] = {}
    for path in files:  # sorted paths: appending keeps (source, row) order inside every batch
        for row, sample in enumerate(pq.read_table(path, columns=SLIM_COLUMNS).to_pylist()):
            sample["trainable"] = trainable_tokens(sample)
            del sample["loss_mask"]  # only its sum is needed until the write
            batches.setdefault(sample["step"], []).append((path, row, sample))

    fields: dict[str, list[dict | None]] = {}
    for samples in batches.values():
        groups: dict[int, list[tuple[str, int, dict]]] = {}
        for item in samples:
            groups.setdefault(item[2]["group_index"], []).append(item)
        for ordinal, members in enumerate(groups.values()):  # dict order = order of first row
            rollouts: dict[object, list[tuple[str, int, dict]]] = {}
            for source, row, sample in members:
                key = sample["rollout_id"] if sample["rollout_id"] is not None else sample["index"]
                sample["rollout_key"] = key
                rollouts.setdefault(("key", key) if key is not None else ("alone", source, row), []).append(
                    (source, row, sample))
            mainstream = []
            for rows in rollouts.values():
                best = rows[0]
                for item in rows[1:]:
                    if item[2]["trainable"] > best[2]["trainable"]:
                        best = item
                mainstream.append(best)
            advantages = group_advantages([item[2]["reward"] for item in mainstream])
            for rows, best, advantage in zip(rollouts.values(), mainstream, advantages):
                mask_sum = sum(item[2]["trainable"] for item in rows)
                for source, row, sample in rows:
                    out = fields.setdefault(source, [])
                    if len(out) <= row:
                        out.extend([None] * (row + 1 - len(out)))
                    out[row] = {
                        "raw_reward": sample["reward"],
                        "advantage": advantage,
                        "mainstream": (source, row) == best[:2],
                        "rollout_key": sample["rollout_key"],
                        "prompt_group": ordinal,
                        "rollout_mask_sum": mask_sum,
                    }
    return fields


def write(path: str, out_path: str, fields: list[dict]) -> None:
    table = pq.read_table(path)
    samples = table.to_pylist()
    for sample, extra in zip(samples, fields):
        length = sample.get("response_length") or 0
        mask = sample.get("loss_mask")
        if sample.get("remove_sample"):
            mask = [0] * (len(mask) if mask is not None else max(length, 0))
        elif mask is None:
            mask = [1] * max(length, 0)
        sample["loss_mask"] = mask
        sample.update(extra)
        sample["truncated"] = sample.get("status") == "truncated"
    schema = pa.schema(list(table.schema) + ADDED_FIELDS).remove_metadata()
    out = pa.Table.from_pylist(samples, schema=schema)
    pq.write_table(out, out_path, **parquet_write_options(out.schema))


def main() -> None:
    args = parse_args(__doc__)
    files = input_files(args.input)
    fields = compute(files)
    for path in files:
        write(path, output_path(args.output, path, args.input), fields.get(path, []))


if __name__ == "__main__":
    main()
