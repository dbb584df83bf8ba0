"""What the numeric core needs to know about a run: plain values, no Beam."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

SEMANTICS = ("legacy-reshape", "group-index", "rollout-mainstream", "rollout-shared")
SEMANTICS_VERSION = {name: 1 for name in SEMANTICS}
# Version 2 of the contract (docs/estimators.md): a run that uses any of its
# estimators or options records this version; every other run keeps its semantics' version (and fingerprint).
CONTRACT_V2 = 2
ROW_UNIT_SEMANTICS = ("legacy-reshape", "group-index")
MAINSTREAM_POLICIES = ("most-trainable", "last", "shared")
STD_ESTIMATORS = ("grpo", "gspo", "cispo")
CENTRE_ONLY_ESTIMATORS = ("reinforce_plus_plus_baseline", "dr_grpo")
RLOO = "rloo"
GRPO_PASSK, OPO, GPG, REMAX, GDPO = "grpo_passk", "opo", "gpg", "remax", "gdpo"
WIDER_FIELD_ESTIMATORS = (GRPO_PASSK, OPO, GPG, REMAX, GDPO)
BATCH_LEVEL_ESTIMATORS = (GPG, GDPO)  # a batch-level step: they need a whole batch in one call
SINGLETON_RULES = ("zero", "raw")     # one-unit groups: advantage 0, or mean 0 / std 1 (verl)
# the estimators that normalize rewards within groups (any other name passes the reward through)
NORMALIZING_ESTIMATORS = STD_ESTIMATORS + CENTRE_ONLY_ESTIMATORS + (RLOO,) + WIDER_FIELD_ESTIMATORS
STD_EPS = 1e-6
WHITEN_EPS = 1e-8                     # verl's masked_whiten / masked_mean


def since(version: int, values: tuple | None = None) -> dict:
    """Field metadata: the option belongs to this version of the contract. In use (so the run records that
    version) when it is not its default, or, with `values`, when it is one of them."""
    return {"contract_version": version, "values": values}


@dataclass(frozen=True)
class CoreConfig:
    semantics: str = "rollout-mainstream"
    estimator: str = field(default="grpo", metadata=since(CONTRACT_V2, WIDER_FIELD_ESTIMATORS))
    std_normalization: bool = True
    rewards_normalization: bool = True
    mainstream: str | None = None  # None: the semantics' default
    n_samples_per_prompt: int | None = None
    rollout_batch_size: int | None = None
    # version 2 of the contract; each default leaves the run as it was (and out of its record)
    singleton_groups: str = field(default="zero", metadata=since(CONTRACT_V2))
    # the reward is a struct/map: these numeric fields
    reward_keys: tuple[str, ...] | None = field(default=None, metadata=since(CONTRACT_V2))
    reward_weights: tuple[float, ...] | None = field(default=None, metadata=since(CONTRACT_V2))  # None: all 1

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
        if self.singleton_groups not in SINGLETON_RULES:
            raise ValueError(f"--singleton-groups {self.singleton_groups!r}: choose one of "
                             f"{', '.join(SINGLETON_RULES)}")
        if self.singleton_groups != "zero" and self.semantics == "legacy-reshape":
            raise ValueError("--singleton-groups raw is not accepted with legacy-reshape, which stays as it was")
        self._check_reward_fields()

    def _check_reward_fields(self):
        # lists from the command line or a run config become tuples: the config stays hashable and frozen
        if self.reward_keys is not None:
            keys = tuple(str(k) for k in self.reward_keys)
            object.__setattr__(self, "reward_keys", keys)
            if not keys or any(not k for k in keys):
                raise ValueError(f"--reward-keys needs one or more non-empty names, got {','.join(keys)!r}")
            if len(set(keys)) != len(keys):
                raise ValueError(f"--reward-keys names a field twice: {','.join(keys)}")
        if self.reward_weights is not None:
            weights = tuple(float(w) for w in self.reward_weights)
            object.__setattr__(self, "reward_weights", weights)
            if self.reward_keys is None:
                raise ValueError("--reward-weights needs --reward-keys (one weight per key)")
            if len(weights) != len(self.reward_keys):
                raise ValueError(f"--reward-weights has {len(weights)} value(s) but --reward-keys names "
                                 f"{len(self.reward_keys)} field(s)")
            if not all(math.isfinite(w) for w in weights):
                raise ValueError(f"--reward-weights must be finite numbers, got {','.join(map(str, weights))}")
        if self.estimator == GDPO and self.reward_keys is None:
            raise ValueError("--estimator gdpo needs --reward-keys K1,K2,... (the reward is a struct/map)")

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
        return self.rewards_normalization and self.estimator in NORMALIZING_ESTIMATORS

    @property
    def divides_by_std(self) -> bool:
        """Group statistics divide by std: grpo/gspo/cispo, and grpo_passk and gdpo (per key), with the std flag."""
        return self.normalizes and self.std_normalization and self.estimator in (
            STD_ESTIMATORS + (GRPO_PASSK, GDPO))

    @property
    def raw_singletons(self) -> bool:
        """One-unit groups take mean 0 and std 1 (verl) instead of advantage 0."""
        return self.singleton_groups == "raw"

    @property
    def weights(self) -> tuple[float, ...] | None:
        """One weight per reward key (all 1 when not given), or None without --reward-keys."""
        if self.reward_keys is None:
            return None
        return self.reward_weights if self.reward_weights is not None else (1.0,) * len(self.reward_keys)

    def contract_versions_in_use(self) -> set[int]:
        """The contract versions of the options in use, from each field's metadata (`since`)."""
        used = set()
        for f in fields(self):
            if "contract_version" not in f.metadata:
                continue
            value, values = getattr(self, f.name), f.metadata["values"]
            if (value in values) if values is not None else (value != f.default):
                used.add(f.metadata["contract_version"])
        return used

    @property
    def uses_contract_v2(self) -> bool:
        """Any estimator or option of version 2 of the contract is in use."""
        return CONTRACT_V2 in self.contract_versions_in_use()

    @property
    def version(self) -> int:
        """The version a run records: its semantics', or the newest of the contract's options it uses."""
        return max({SEMANTICS_VERSION[self.semantics], *self.contract_versions_in_use()})
