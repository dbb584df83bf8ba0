"""Stand-ins for slime / miles Sample objects: exactly the attributes and methods the reward hooks may use."""
from __future__ import annotations

import enum
import random

ALLOWED = frozenset({"get_reward_value", "group_index", "rollout_id", "index", "loss_mask", "response_length",
                     "remove_sample", "status", "metadata", "reward"})


class Status(enum.Enum):  # Sample.Status in both frameworks
    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"


class StandInSample:
    """What the trainers' Sample has and the hooks may read; reading anything else is recorded in `touched`."""
    __slots__ = ("group_index", "index", "rollout_id", "reward", "loss_mask", "response_length", "remove_sample",
                 "status", "metadata")
    touched: set[str] = set()

    def __init__(self, **fields):
        for name in self.__slots__:
            setattr(self, name, fields.get(name))

    def __getattribute__(self, name):
        if not name.startswith("__") and name not in ("to_dict",):
            StandInSample.touched.add(name)
        return object.__getattribute__(self, name)

    def get_reward_value(self, args):
        """As slime / miles: the reward, or its field args.reward_key."""
        return self.reward if not args.reward_key else self.reward[args.reward_key]

    def to_dict(self) -> dict:
        """As Sample.to_dict() writes it into a dump (status as its string value)."""
        out = {name: object.__getattribute__(self, name) for name in self.__slots__}
        out["status"] = out["status"].value
        return out


class Args:
    """The trainer's args, with the defaults slime and miles give them."""

    def __init__(self, **given):
        self.advantage_estimator = "grpo"
        self.rewards_normalization = True
        self.grpo_std_normalization = True
        self.n_samples_per_prompt = 1
        self.rollout_batch_size = 1
        self.reward_key = None
        self.__dict__.update(given)


def random_samples(seed: int, prompts: int = 3, rollouts: int = 4, shared_rewards: bool = True,
                   mask_tokens: int = 6) -> list[StandInSample]:
    """One step: prompts x rollouts, each rollout stored as 1-3 rows, contiguous by prompt (as dumps are)."""
    rng = random.Random(seed)
    samples, index = [], 0
    for group in range(prompts):
        for _ in range(rollouts):
            fanout = rng.choice([1, 1, 2, 3])
            rollout_id = None if rng.random() < 0.2 else 1000 + index
            reward = rng.choice([0.0, 0.5, 1.0])
            for _ in range(fanout):
                length = rng.randint(1, mask_tokens)
                mask = None if rng.random() < 0.2 else [rng.choice([0, 1, 1]) for _ in range(length)]
                samples.append(StandInSample(
                    group_index=group, index=index, rollout_id=rollout_id,
                    reward=reward if shared_rewards else rng.choice([0.0, 0.5, 1.0]),
                    loss_mask=mask, response_length=length, remove_sample=rng.random() < 0.05,
                    status=rng.choice([Status.COMPLETED, Status.TRUNCATED]), metadata={"turn": 1}))
            index += 1
    return samples
