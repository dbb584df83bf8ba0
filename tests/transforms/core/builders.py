"""Build CoreInput from readable per-row tuples (test helper)."""
import torch

from transforms.core.reasons import CODE
from transforms.core.types import CoreInput


def core_input(rows, *, batches=None, sizes=None):
    """rows: dicts with reward and optional trainable, group_index, rollout_id, index, problem, batch."""
    def column(name, default, dtype):
        return torch.tensor([default if r.get(name) is None else r[name] for r in rows], dtype=dtype)

    rollout_key = [r.get("rollout_id") if r.get("rollout_id") is not None else r.get("index") for r in rows]
    batch = column("batch", 0, torch.long)
    num_batches = batches if batches is not None else (int(batch.max()) + 1 if rows else 0)
    trainable = column("trainable", 1, torch.long)
    return CoreInput(
        batch=batch,
        reward=column("reward", 0.0, torch.float64),
        trainable=trainable,
        mask_sum=trainable.clone(),
        group_index=column("group_index", 0, torch.long),
        has_group_index=torch.tensor([r.get("group_index") is not None for r in rows], dtype=torch.bool),
        rollout_key=torch.tensor([0 if k is None else k for k in rollout_key], dtype=torch.long),
        has_rollout_key=torch.tensor([k is not None for k in rollout_key], dtype=torch.bool),
        row_problem=torch.tensor([CODE[r.get("problem", "")] for r in rows], dtype=torch.long),
        num_batches=num_batches,
        prompt_group_sizes=[None if s is None else torch.tensor(s, dtype=torch.long)
                            for s in (sizes or [None] * num_batches)],
    )
