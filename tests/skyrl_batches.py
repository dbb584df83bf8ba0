"""SkyRL training-batch dumps, built here from SkyRL's documented fields (NovaSky-AI/SkyRL@a9564572eb8e:
`TrainingInputBatch` and its pickling in skyrl/backends/skyrl_train/training_batch.py, the tensors' layout in
`convert_prompts_responses_to_batch_tensors`, skyrl/train/dataset/preprocess.py, the padding in
`pad_training_input_batch`, the file name in `RayPPOTrainer.dump_data`, skyrl/train/trainer.py).

The classes below are ours; only their module and qualified names are SkyRL's, registered in sys.modules
while pickling, so `pickle.dump` writes the globals SkyRL's writer writes. The batch pickles as
`_rebuild_tensor_batch(TrainingInputBatch, state)`, each tensor as numpy bytes, a bfloat16 one as a
torch.save blob.
"""
from __future__ import annotations

import contextlib
import io
import os
import pickle
import sys
import types
from dataclasses import dataclass, field

import numpy as np
import torch

MODULE = "skyrl.backends.skyrl_train.training_batch"


def _rebuild_tensor_batch(cls, state):
    raise AssertionError("the tests only write batches")


class TrainingInputBatch(dict):
    def __init__(self, state):
        super().__init__()
        self.state = state

    def __reduce__(self):
        return (_rebuild_tensor_batch, (type(self), self.state))


for _made in (_rebuild_tensor_batch, TrainingInputBatch):
    _made.__module__ = MODULE


@contextlib.contextmanager
def skyrl_names():
    """SkyRL's module path in sys.modules, holding our two objects, while a batch is pickled."""
    names = MODULE.split(".")
    added = []
    for depth in range(1, len(names) + 1):
        name = ".".join(names[:depth])
        if name not in sys.modules:
            sys.modules[name] = types.ModuleType(name)
            added.append(name)
    leaf = sys.modules[MODULE]
    leaf._rebuild_tensor_batch = _rebuild_tensor_batch  # noqa: SLF001 - SkyRL's own (private) name
    leaf.TrainingInputBatch = TrainingInputBatch
    try:
        yield
    finally:
        for name in added:
            del sys.modules[name]


def serialise(array) -> dict:
    """One tensor as SkyRL's state holds it: numpy bytes, or a torch.save blob for bfloat16."""
    if isinstance(array, torch.Tensor):
        buffer = io.BytesIO()
        torch.save(array, buffer)
        return {"format": "torch", "data": buffer.getvalue()}
    array = np.ascontiguousarray(array)
    return {"format": "numpy", "data": array.tobytes(), "shape": array.shape, "dtype": str(array.dtype)}


@dataclass
class Rollout:
    prompt: list[int]
    response: list[int]
    loss_mask: list[int]
    advantages: list[float]  # one per response token (SkyRL broadcasts one value; a test may vary them)
    logprobs: list[float] = field(default_factory=list)


def batch_state(groups: list[list[Rollout]], pad_size: int = 0, bf16_keys: tuple[str, ...] = ("base_action_log_probs",),
                metadata_extra: dict | None = None) -> dict:
    """The state `TensorBatch.__getstate__` gives for these prompt groups, padded by `pad_size` copies of row 0."""
    rows = [r for g in groups for r in g]
    n = len(rows)
    total = max(len(r.prompt) + len(r.response) for r in rows)
    width = max(len(r.response) for r in rows)
    sequences = np.zeros((n, total), np.int64)
    attention = np.zeros((n, total), np.int64)
    response_mask = np.zeros((n, width), np.int64)
    loss_mask = np.zeros((n, width), np.float32)
    advantages = np.zeros((n, width), np.float32)
    logprobs = np.zeros((n, width), np.float32)
    for i, r in enumerate(rows):  # left-padded sequences; response-wide tensors right-aligned
        tokens = r.prompt + r.response
        sequences[i, total - len(tokens):] = tokens
        attention[i, total - len(tokens):] = 1
        k = len(r.response)
        response_mask[i, width - k:] = 1
        loss_mask[i, width - k:] = r.loss_mask
        advantages[i, width - k:] = r.advantages
        logprobs[i, width - k:] = r.logprobs or [-0.5] * k
    tensors = {"sequences": sequences, "attention_mask": attention, "response_mask": response_mask,
               "loss_mask": loss_mask, "rollout_logprobs": logprobs, "advantages": advantages,
               "returns": advantages.copy(), "action_log_probs": logprobs - 0.01,
               "base_action_log_probs": logprobs - 0.02}
    if pad_size:
        for key, value in tensors.items():
            pad = np.zeros((pad_size, *value.shape[1:]), value.dtype) if key == "loss_mask" \
                else np.repeat(value[:1], pad_size, axis=0)
            tensors[key] = np.concatenate([value, pad])
    boundaries, at = [], 0
    for g in groups:
        boundaries.append((at, at + len(g)))
        at += len(g)
    batch_dict = {key: serialise(torch.from_numpy(value).to(torch.bfloat16) if key in bf16_keys else value)
                  for key, value in tensors.items()}
    batch_dict.update({"values": None, "rollout_expert_indices": None, "router_padding_mask": None,
                       "pixel_values": None, "image_grid_thw": None})
    metadata = {"policy_mini_batch_boundaries": [(0, n)], "policy_prompt_boundaries": boundaries,
                "response_length": width, "avg_response_length": sum(len(r.response) for r in rows) / n,
                "pad_size": pad_size, "metrics": {"avg_final_rewards": 0.5, "avg_advantages": 0.0}}
    metadata.update(metadata_extra or {})
    return {"batch_dict": batch_dict, "batch_size": n + pad_size, "device": torch.device("cpu"),
            "metadata": metadata}


def write_batch(folder, step: int, state: dict) -> str:
    """`{folder}/dumped_data/global_step_{step}_training_input.pkl`, pickled as TensorBatch.save does."""
    target = os.path.join(folder, "dumped_data")
    os.makedirs(target, exist_ok=True)
    path = os.path.join(target, f"global_step_{step}_training_input.pkl")
    with skyrl_names(), open(path, "wb") as handle:
        pickle.dump(TrainingInputBatch(state), handle)
    return path
