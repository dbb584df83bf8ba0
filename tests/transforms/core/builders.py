"""Build CoreInput from readable per-row tuples, and run the core on each backend (test helpers)."""
import numpy as np

from rollout_relabel.transforms.core.advantages import compute_advantages
from rollout_relabel.transforms.core.arrays import TORCH_CPU
from rollout_relabel.transforms.core.reasons import CODE, REASONS
from rollout_relabel.transforms.core.types import CoreInput, CoreOutput

# numpy (the CPU backend) and torch on the CPU: the torch code path a GPU runs, checked without one
DEVICES = ["cpu", TORCH_CPU]


def relabel_on(inp: CoreInput, config, device: str, drop_uniform_groups: bool = False) -> CoreOutput:
    """The core on `device`, its output back as numpy arrays."""
    return compute_advantages(inp.to(device), config, drop_uniform_groups).to("cpu")


def reasons(out: CoreOutput) -> list[str]:
    """Each row's problem as the reason name its dead letter carries ("" for a written row)."""
    return [REASONS[code] for code in out.problem.tolist()]


def core_input(rows, *, batches=None, sizes=None):
    """rows: dicts with reward and optional trainable, group_index, rollout_id, index, problem, batch,
    parts (gdpo: the row's per-key values), baseline (remax; None: missing), version (--max-staleness;
    None: missing) and metric (--filter-metric: given when any row has the key; None: missing)."""
    def column(name, default, dtype):
        return np.array([default if r.get(name) is None else r[name] for r in rows], dtype=dtype)

    rollout_key = [r.get("rollout_id") if r.get("rollout_id") is not None else r.get("index") for r in rows]
    batch = column("batch", 0, np.int64)
    num_batches = batches if batches is not None else (int(batch.max()) + 1 if rows else 0)
    trainable = column("trainable", 1, np.int64)
    return CoreInput(
        batch=batch,
        reward=column("reward", 0.0, np.float64),
        trainable=trainable,
        mask_sum=trainable.copy(),
        group_index=column("group_index", 0, np.int64),
        has_group_index=np.array([r.get("group_index") is not None for r in rows], dtype=bool),
        rollout_key=np.array([0 if k is None else k for k in rollout_key], dtype=np.int64),
        has_rollout_key=np.array([k is not None for k in rollout_key], dtype=bool),
        row_problem=np.array([CODE[r.get("problem", "")] for r in rows], dtype=np.int64),
        num_batches=num_batches,
        prompt_group_sizes=[None if s is None else np.array(s, dtype=np.int64)
                            for s in (sizes or [None] * num_batches)],
        reward_parts=(np.ascontiguousarray(np.array([r.get("parts") for r in rows], dtype=np.float64).T)
                      if rows and rows[0].get("parts") is not None else None),
        baseline=np.array([np.nan if r.get("baseline") is None else r["baseline"] for r in rows], dtype=np.float64),
        version=np.array([np.nan if r.get("version") is None else r["version"] for r in rows], dtype=np.float64),
        metric=(np.array([np.nan if r.get("metric") is None else r["metric"] for r in rows], dtype=np.float64)
                if any("metric" in r for r in rows) else None),
    )
