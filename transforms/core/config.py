"""What the numeric core needs to know about a run: plain values, no Beam."""
from __future__ import annotations

from dataclasses import dataclass

SEMANTICS = ("legacy-reshape", "group-index", "rollout-mainstream", "rollout-shared")
SEMANTICS_VERSION = {name: 1 for name in SEMANTICS}
ROW_UNIT_SEMANTICS = ("legacy-reshape", "group-index")
MAINSTREAM_POLICIES = ("most-trainable", "last", "shared")
STD_ESTIMATORS = ("grpo", "gspo", "cispo")
CENTRE_ONLY_ESTIMATORS = ("reinforce_plus_plus_baseline", "dr_grpo")
RLOO = "rloo"
STD_EPS = 1e-6


@dataclass(frozen=True)
class CoreConfig:
    semantics: str = "rollout-mainstream"
    estimator: str = "grpo"
    std_normalization: bool = True
    rewards_normalization: bool = True
    mainstream: str | None = None  # None: the semantics' default
    n_samples_per_prompt: int | None = None
    rollout_batch_size: int | None = None

    def __post_init__(self):
        if self.semantics not in SEMANTICS:
            raise ValueError(f"unknown semantics {self.semantics!r}; choose one of {', '.join(SEMANTICS)}")
        if self.mainstream is not None:
            if self.mainstream not in MAINSTREAM_POLICIES:
                raise ValueError(
                    f"unknown mainstream policy {self.mainstream!r}; choose one of {', '.join(MAINSTREAM_POLICIES)}")
            if self.row_units:
                raise ValueError(f"--mainstream applies to rollout semantics only, not {self.semantics}")
        for name in ("n_samples_per_prompt", "rollout_batch_size"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if not self.estimator or not self.estimator.replace("_", "").isalnum():
            raise ValueError(f"estimator name {self.estimator!r} is not a valid identifier")

    @property
    def row_units(self) -> bool:
        """Every row is its own unit (no rollout dedup)."""
        return self.semantics in ROW_UNIT_SEMANTICS

    @property
    def policy(self) -> str:
        """Which row of a rollout supplies the mainstream flag (and reward)."""
        if self.mainstream in ("most-trainable", "last"):
            return self.mainstream
        return "most-trainable"

    @property
    def require_shared_rewards(self) -> bool:
        return self.semantics == "rollout-shared" or self.mainstream == "shared"

    @property
    def normalizes(self) -> bool:
        return self.rewards_normalization and self.estimator in (
            STD_ESTIMATORS + CENTRE_ONLY_ESTIMATORS + (RLOO,))

    @property
    def divides_by_std(self) -> bool:
        return self.normalizes and self.std_normalization and self.estimator in STD_ESTIMATORS

    @property
    def version(self) -> int:
        return SEMANTICS_VERSION[self.semantics]
