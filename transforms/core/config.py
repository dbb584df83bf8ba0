"""What the numeric core needs to know about a run: plain values, no Beam."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from enum import StrEnum, unique
from typing import TypedDict

from .estimators import Estimator, estimators
from .option_facts import Kind, Scope, option
from .turn_credit import DEFAULT_GAMMA


@unique
class Semantics(StrEnum):
    """How rows form prompt groups and units (docs/semantics.md, "Semantics")."""
    LEGACY_RESHAPE = "legacy-reshape"
    GROUP_INDEX = "group-index"
    ROLLOUT_MAINSTREAM = "rollout-mainstream"
    ROLLOUT_SHARED = "rollout-shared"

    @property
    def row_units(self) -> bool:
        """Every row is its own unit (no rollout dedup)."""
        return self in (Semantics.LEGACY_RESHAPE, Semantics.GROUP_INDEX)


SEMANTICS_VERSION = {semantics: 1 for semantics in Semantics}
# Version 2 of the contract (docs/estimators.md): a run that uses any of its
# estimators or options records this version; every other run keeps its semantics' version (and fingerprint).
CONTRACT_V2 = 2
# Version 3 of the contract (docs/semantics.md): grpo_loo, remax per unit (its outputs changed), and
# the off-policy options; a run using any of them records version 3.
CONTRACT_V3 = 3
# Version 4 (docs/estimators.md, "Turn-level credit"; docs/semantics.md): the turn-level estimators and their
# options, a std epsilon a preset may set to reproduce its framework's numbers, and row weights.
CONTRACT_V4 = 4
NORM_LEVELS = ("group", "batch", "none")  # ROLL's norm_mean_type / norm_std_type ("none": ROLL's None)
TURN_HOOK_REFUSES = "a Sample is a whole trajectory: the hooks refuse the turn-level estimators"
MAINSTREAM_POLICIES = ("most-trainable", "last", "shared")
SINGLETON_RULES = ("zero", "raw")     # one-unit groups: advantage 0, or mean 0 / std 1 (verl)
STALE_ROWS = ("baseline-only", "drop")  # stale units: in their group's statistics, or removed before them
ZERO_MASK_UNITS = ("baseline", "exclude")  # units with no trainable token: in the statistics, or left out
ROW_WEIGHTS = ("none", "rollout", "tokens")  # each row's loss weight: none, 1/N per rollout, its token share
ROW_WEIGHT_SCALES = ("batch", "none")        # weights divided by their batch mean (the loss keeps its size), or not
STD_EPS = 1e-6                        # --std-epsilon's default (verl, slime); AReaL adds 1e-5
WHITEN_EPS = 1e-8                     # verl's masked_whiten / masked_mean


def since(version: int, values: tuple | None = None) -> dict:
    """Field metadata: the option belongs to this version of the contract. In use (so the run records that
    version) when it is not its default, or, with `values`, when it is one of them."""
    return {"contract_version": version, "values": values}


ESTIMATOR_HELP = (", ".join(estimators(passes_through=False)) + " (remax needs --baseline-column, gdpo --reward-keys; "
                  "default {default}); " + ", ".join(estimators(passes_through=True)) + " pass through")


@dataclass(frozen=True)
class CoreConfig:
    """The labeling options the numeric core reads. Each field is an option: its facts (flag, help, how
    `relabel compare` and the reward hooks treat it) are declared on it (transforms/core/option_facts.py)."""
    semantics: Semantics = option(Semantics.ROLLOUT_MAINSTREAM, "normalization semantics (docs/semantics.md)",
                                  "group-index", choices=tuple(s.value for s in Semantics), label="{}",
                                  always_shown=True)
    # the version a run records follows the estimator's row (estimators.py): remax's outputs changed in version 3
    estimator: Estimator = option(
        Estimator.GRPO, ESTIMATOR_HELP, Estimator.DR_GRPO, label="estimator {}", always_shown=True,
        trainer_arg="advantage_estimator",
        metadata=dict(since(CONTRACT_V2, estimators(since=CONTRACT_V2)),
                      later={v: estimators(version=v) for v in sorted({e.facts.version for e in Estimator})
                             if v > CONTRACT_V2}))
    std_normalization: bool = option(True, "divide by the group std (grpo/gspo/cispo; default on)", "false",
                                     kind=Kind.SWITCH, label="std {}", always_shown=True,
                                     trainer_arg="grpo_std_normalization", spec_key="std")
    rewards_normalization: bool = option(True, "advantage = reward value, unchanged", "0", kind=Kind.OFF,
                                         flag="--no-rewards-normalization", label="no rewards normalization",
                                         trainer_arg="rewards_normalization")
    # None: the semantics' default
    mainstream: str | None = option(None, "which row of a rollout supplies its reward (rollout semantics only)",
                                    "last", choices=MAINSTREAM_POLICIES, label="mainstream {}",
                                    example_needs=(("semantics", "rollout-mainstream"),))
    n_samples_per_prompt: int | None = option(None, "positional groups of N rows", "4", metavar="N",
                                              label="n {}", trainer_arg="n_samples_per_prompt")
    rollout_batch_size: int | None = option(None, "with N: a batch of N*B rows is sliced", "3", metavar="B",
                                            label="batch size {}", trainer_arg="rollout_batch_size")
    # version 2 of the contract; each default leaves the run as it was (and out of its record)
    singleton_groups: str = option("zero", "one-unit groups: zero or raw (as verl; default {default})", "raw",
                                   choices=SINGLETON_RULES, label="one-unit groups {}", metadata=since(CONTRACT_V2))
    # the reward is a struct/map: these numeric fields (what the reward is: the run's, not a compare side's)
    reward_keys: tuple[str, ...] | None = option(
        None, "a struct/map reward: the weighted sum of these fields (gdpo: per field)",
        "acc,format", metavar="K1,K2,...", scope=Scope.RUN, label="reward keys {}",
        metadata=since(CONTRACT_V2))
    # None: all 1
    reward_weights: tuple[float, ...] | None = option(
        None, "one weight per --reward-keys field (default all 1)", "1,0.5", metavar="W1,W2,...", scope=Scope.RUN,
        label="weighted {}", example_needs=(("reward_keys", "acc,format"),), metadata=since(CONTRACT_V2))
    # version 3 of the contract (off-policy preprocessing); each default leaves the run as it was
    # a unit older than current - K versions is stale (needs row versions)
    max_staleness: int | None = option(
        None, "units more than K versions old are stale: filtered (reason stale)", "2", metavar="K",
        label="max staleness {}", example_needs=(("version_column", "weight_versions"),),
        help_topic="off-policy", metadata=since(CONTRACT_V3))
    # None: the largest row version of the batch
    current_version: int | None = option(
        None, "the current weight version (default: the batch's newest)", "7", metavar="V",
        label="current version {}", example_needs=(("max_staleness", "2"),),
        help_topic="off-policy", metadata=since(CONTRACT_V3))
    # stale units: kept in the statistics (not written), or dropped first
    stale_rows: str = option("baseline-only", "baseline-only (default: stale units stay in the statistics) or drop",
                             "drop", choices=STALE_ROWS, metavar="MODE", label="stale rows {}",
                             example_needs=(("max_staleness", "2"),),
                             help_topic="off-policy", metadata=since(CONTRACT_V3))
    # "exclude": a unit with no trainable token is out of the statistics
    zero_mask_units: str = option("baseline", "baseline (default), or exclude: no-token units out of the statistics",
                                  "exclude", choices=ZERO_MASK_UNITS, metavar="MODE", label="zero-mask units {}",
                                  help_topic="off-policy", metadata=since(CONTRACT_V3))
    # "LO:HI": groups whose mean metric lies outside are filtered
    keep_band: str | None = option(None, "groups whose mean metric is outside [LO, HI] are filtered (metric-band)",
                                   "0.1:0.9", metavar="LO:HI", label="band {}",
                                   help_topic="off-policy", metadata=since(CONTRACT_V3))
    # a group is uniform when max - min of its unit values <= this
    uniform_tolerance: float = option(0.0, "uniform (advantage 0) when unit values differ by <= EPS (default 0)",
                                      "0.01", metavar="EPS", label="uniform tolerance {}",
                                      help_topic="off-policy", metadata=since(CONTRACT_V3))
    # version 4 of the contract: one weight per rollout in the loss (a `loss_weight` column; advantages unchanged)
    row_weight: str = option(
        "none", "loss_weight: none (default), rollout (1/N per rollout) or tokens (share)", "rollout",
        choices=ROW_WEIGHTS, metavar="MODE", label="row weight {}",
        hook_refuses="slime and miles samples have no loss-weight field (weigh a stored dump with relabel run, "
        "or fold it into the reward with relabel export --fold-row-weight)", metadata=since(CONTRACT_V4))
    row_weight_scale: str = option(
        "batch", "batch (default: weights of mean 1 per batch) or none", "none", choices=ROW_WEIGHT_SCALES,
        metavar="SCALE", label="row weight scale {}",
        example_needs=(("row_weight", "rollout"),), hook_refuses="slime and miles samples have no loss-weight field",
        metadata=since(CONTRACT_V4))
    # version 4: the turn-level estimators' options (a usage error with any other estimator); each default
    # leaves the run as it was. None: the estimator's default (turn_credit.DEFAULT_GAMMA)
    turn_gamma: float | None = option(
        None, "the per-turn discount, 0..1 (default 0.95 step_reinforce/gigpo, else 1.0)", "0.9",
        metavar="G", label="turn gamma {}", example_needs=(("estimator", Estimator.STEP_REINFORCE),),
        hook_refuses=TURN_HOOK_REFUSES, help_topic="turns", metadata=since(CONTRACT_V4))
    # None: group
    norm_mean_type: str | None = option(
        None, "step_reinforce, gigpo: the mean level, group (default), batch or none (ROLL norm_mean_type)", "batch",
        choices=NORM_LEVELS, metavar="LEVEL", label="norm mean {}",
        example_needs=(("estimator", Estimator.STEP_REINFORCE),),
        hook_refuses=TURN_HOOK_REFUSES, help_topic="turns", metadata=since(CONTRACT_V4))
    # None: group, or none under --no-std-normalization
    norm_std_type: str | None = option(
        None, "turn estimators: the std level, group (default), batch or none (ROLL norm_std_type)", "batch",
        choices=NORM_LEVELS, metavar="LEVEL", label="norm std {}",
        example_needs=(("estimator", Estimator.STEP_REINFORCE),),
        hook_refuses=TURN_HOOK_REFUSES, help_topic="turns", metadata=since(CONTRACT_V4))
    episode_reward_weight: float = option(
        1.0, "gigpo: the episode part's weight (ROLL episode_reward_weight; default 1)", "0.5", metavar="W",
        label="episode weight {}", example_needs=(("estimator", Estimator.GIGPO), ("state_column", "state")),
        hook_refuses=TURN_HOOK_REFUSES, help_topic="turns", metadata=since(CONTRACT_V4))
    step_reward_weight: float = option(
        1.0, "gigpo, gigpo_verl_agent: the step part's weight (ROLL step_reward_weight, verl-agent "
        "step_advantage_w; default 1)", "0.5", metavar="W", label="step weight {}",
        example_needs=(("estimator", Estimator.GIGPO), ("state_column", "state")), hook_refuses=TURN_HOOK_REFUSES,
        help_topic="turns", metadata=since(CONTRACT_V4))

    # version 4: the epsilon added to a group's std before dividing by it (AReaL's NormConfig.eps is 1e-5)
    # version 4: the std a group mean divides by: 1 the sample std (verl, slime), 0 the population std (rllm's
    # np.std)
    std_ddof: int = option(1, "the group std's ddof: 1 (default, sample std) or 0 (population)",
                           "0", metavar="D", label="std ddof {}", metadata=since(CONTRACT_V4))
    std_epsilon: float = option(STD_EPS, "added to the group std before dividing by it (default {default})", "1e-05",
                                metavar="E", label="std epsilon {}", metadata=since(CONTRACT_V4))

    def __post_init__(self) -> None:
        if self.semantics not in tuple(Semantics):
            raise ValueError(f"unknown semantics {self.semantics!r}; choose one of {', '.join(Semantics)}")
        object.__setattr__(self, "semantics", Semantics(self.semantics))
        if self.mainstream is not None:
            if self.mainstream not in MAINSTREAM_POLICIES:
                raise ValueError(
                    f"unknown mainstream policy {self.mainstream!r}; choose one of {', '.join(MAINSTREAM_POLICIES)}")
            if self.semantics.row_units:
                raise ValueError(f"--mainstream applies to rollout semantics only, not {self.semantics}")
        for name in ("n_samples_per_prompt", "rollout_batch_size"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if self.estimator not in tuple(Estimator):
            raise ValueError(f"unknown estimator {self.estimator!r}; choose one of {', '.join(Estimator)} "
                             f"(only {', '.join(estimators(passes_through=True))} pass rewards through)")
        object.__setattr__(self, "estimator", Estimator(self.estimator))
        _check_choice("singleton_groups", self.singleton_groups, SINGLETON_RULES)
        if self.singleton_groups != "zero" and self.semantics == Semantics.LEGACY_RESHAPE:
            raise ValueError("--singleton-groups raw is not accepted with legacy-reshape, which stays as it was")
        self._check_reward_fields()
        self._check_off_policy()
        object.__setattr__(self, "std_ddof", int(self.std_ddof))
        if self.std_ddof not in (0, 1):
            raise ValueError(f"--std-ddof must be 0 or 1, got {self.std_ddof}")
        _check_choice("row_weight", self.row_weight, ROW_WEIGHTS)
        _check_choice("row_weight_scale", self.row_weight_scale, ROW_WEIGHT_SCALES)
        if self.row_weight == "none" and self.row_weight_scale != "batch":
            raise ValueError(f"--row-weight-scale {self.row_weight_scale} needs --row-weight rollout|tokens")
        self._check_turn_options()

    def _check_turn_options(self):
        """The turn-level estimators' usage errors (docs/estimators.md, "Turn-level credit")."""
        for name in ("turn_gamma", "episode_reward_weight", "step_reward_weight"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, float(value))
        for name in ("norm_mean_type", "norm_std_type"):
            value = getattr(self, name)
            if value is not None:
                _check_choice(name, value, NORM_LEVELS)
        estimator, turn = self.estimator, self.estimator.facts.per_row
        given = [name for name in ("turn_gamma", "norm_mean_type", "norm_std_type") if getattr(self, name) is not None]
        given += [name for name in ("episode_reward_weight", "step_reward_weight") if getattr(self, name) != 1.0]
        if not turn:
            if given:
                raise ValueError(f"{', '.join(map(_flag, given))}: only with a turn-level estimator "
                                 f"({', '.join(estimators(per_row=True))}), not {estimator}")
            return
        if self.turn_gamma is not None and not (math.isfinite(self.turn_gamma) and 0.0 <= self.turn_gamma <= 1.0):
            raise ValueError(f"--turn-gamma must be a finite number in [0, 1], got {self.turn_gamma}")
        for name in ("episode_reward_weight", "step_reward_weight"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{_flag(name)} must be a finite number, got {getattr(self, name)}")
        refused = {
            "--semantics legacy-reshape": self.semantics == Semantics.LEGACY_RESHAPE,
            "--mainstream": self.mainstream is not None,
            "--zero-mask-units exclude": self.zero_mask_units == "exclude",
            "--max-staleness": self.max_staleness is not None,
            "--keep-band": self.keep_band is not None,
        }
        for what, is_set in refused.items():
            if is_set:
                raise ValueError(f"{what} is not accepted with --estimator {estimator}: each row is a turn of its "
                                 "rollout (docs/estimators.md, \"Turn-level credit\")")
        if self.norm_std_type in ("group", "batch") and not self.std_normalization:
            raise ValueError(f"--no-std-normalization contradicts --norm-std-type {self.norm_std_type} "
                             "(--no-std-normalization is --norm-std-type none)")
        if estimator == Estimator.TURN_DISCOUNT:
            if self.norm_mean_type is not None or self.norm_std_type is not None:
                raise ValueError("--norm-mean-type and --norm-std-type do not apply to turn_discount (the "
                                 "discounted return, not normalized)")
        if estimator == Estimator.GIGPO_VERL_AGENT:
            if self.norm_mean_type not in (None, "group"):
                raise ValueError(f"--norm-mean-type {self.norm_mean_type}: gigpo_verl_agent takes only group "
                                 "(verl-agent centres each prompt group and state group)")
            if self.norm_std_type == "batch":
                raise ValueError("--norm-std-type batch: gigpo_verl_agent takes group (mean_std_norm) or none "
                                 "(mean_norm)")
        if self.episode_reward_weight != 1.0 and estimator != Estimator.GIGPO:
            raise ValueError(f"--episode-reward-weight applies to gigpo only, not {estimator}")
        if self.step_reward_weight != 1.0 and "state" not in estimator.facts.reads:
            raise ValueError(f"--step-reward-weight applies to gigpo and gigpo_verl_agent only, not {estimator}")

    def _check_off_policy(self):
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ValueError(f"--max-staleness must be >= 0, got {self.max_staleness}")
        if self.max_staleness is None:
            if self.current_version is not None:
                raise ValueError("--current-version needs --max-staleness K (staleness = current - version)")
            if self.stale_rows != "baseline-only":
                raise ValueError(f"--stale-rows {self.stale_rows} needs --max-staleness K")
        _check_choice("stale_rows", self.stale_rows, STALE_ROWS)
        _check_choice("zero_mask_units", self.zero_mask_units, ZERO_MASK_UNITS)
        tolerance = float(self.uniform_tolerance)
        object.__setattr__(self, "uniform_tolerance", tolerance)
        if not (math.isfinite(tolerance) and tolerance >= 0):
            raise ValueError(f"--uniform-tolerance must be a finite number >= 0, got {self.uniform_tolerance}")
        if self.keep_band is not None:
            object.__setattr__(self, "keep_band", _band_text(self.keep_band))
        epsilon = float(self.std_epsilon)
        object.__setattr__(self, "std_epsilon", epsilon)
        if not (math.isfinite(epsilon) and epsilon >= 0):
            raise ValueError(f"--std-epsilon must be a finite number >= 0, got {self.std_epsilon}")

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
        if "reward_keys" in self.estimator.facts.options and self.reward_keys is None:
            raise ValueError(f"--estimator {self.estimator} needs --reward-keys K1,K2,... (the reward is a struct/map)")

    @property
    def row_units(self) -> bool:
        """Every row is its own unit (no rollout dedup): the semantics says so, or the estimator gives each
        row its own advantage (its rollouts are then trajectories of rows, every row mainstream)."""
        return self.semantics.row_units or self.estimator.facts.per_row

    @property
    def batch_level(self) -> bool:
        """A step over a whole batch (a row stream, one prompt group at a time, refuses it): the estimator's
        row says so (gpg, gdpo, ROLL's gigpo), or a turn estimator normalizes at the batch level."""
        if not self.normalizes:
            return False
        facts = self.estimator.facts
        return facts.batch_level or (facts.per_row and "batch" in (self.mean_level, self.std_level))

    @property
    def gamma(self) -> float:
        """A turn estimator's per-turn discount: --turn-gamma, else the estimator's default."""
        return self.turn_gamma if self.turn_gamma is not None else DEFAULT_GAMMA[self.estimator]

    @property
    def mean_level(self) -> str:
        """A turn estimator's mean level (--norm-mean-type; group by default)."""
        return self.norm_mean_type or "group"

    @property
    def std_level(self) -> str:
        """A turn estimator's std level: --norm-std-type, else none under --no-std-normalization, else group."""
        if self.norm_std_type is not None:
            return self.norm_std_type
        return "group" if self.std_normalization else "none"

    @property
    def policy(self) -> str:
        """Which row of a rollout supplies the mainstream flag (and reward)."""
        if self.mainstream in ("most-trainable", "last"):
            return self.mainstream
        return "most-trainable"

    @property
    def require_shared_rewards(self) -> bool:
        return self.semantics == Semantics.ROLLOUT_SHARED or self.mainstream == "shared"

    @property
    def normalizes(self) -> bool:
        return self.rewards_normalization and not self.estimator.facts.passes_through

    @property
    def divides_by_std(self) -> bool:
        """Advantages are divided by a std: the estimator's row says it does (estimators.py), and the std
        flag is on."""
        return self.normalizes and self.std_normalization and self.estimator.facts.divides_by_std

    @property
    def band(self) -> tuple[float, float] | None:
        """--keep-band as (low, high), or None."""
        if self.keep_band is None:
            return None
        low, high = self.keep_band.split(":")
        return float(low), float(high)

    @property
    def filters(self) -> bool:
        """Rows may be filtered whatever --drop-uniform-groups says: staleness or a band is set."""
        return self.max_staleness is not None or self.keep_band is not None

    @property
    def stale_dropped(self) -> bool:
        """Stale units are removed before the statistics (--stale-rows drop)."""
        return self.max_staleness is not None and self.stale_rows == "drop"

    @property
    def excludes_zero_mask(self) -> bool:
        return self.zero_mask_units == "exclude"

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

    @property
    def weighs_rows(self) -> bool:
        """Training rows get a loss_weight column (--row-weight rollout|tokens)."""
        return self.row_weight != "none"

    def contract_versions_in_use(self) -> set[int]:
        """The contract versions of the options in use, from each field's metadata (`since`)."""
        used = set()
        for f in fields(self):
            if "contract_version" not in f.metadata:
                continue
            value, values = getattr(self, f.name), f.metadata["values"]
            if (value in values) if values is not None else (value != f.default):
                used.add(f.metadata["contract_version"])
            # values that a later version added or changed (remax per unit since version 3)
            used.update(version for version, later in f.metadata.get("later", {}).items() if value in later)
        return used

    @property
    def version(self) -> int:
        """The version a run records: its semantics', or the newest of the contract's options it uses."""
        return max({SEMANTICS_VERSION[self.semantics], *self.contract_versions_in_use()})


class CoreOptions(TypedDict, total=False):
    """CoreConfig's options as keywords, for a type checker (`**options: Unpack[LabelingOptions]` on the public
    functions, transforms/lib/settings.py); a test holds it to the fields' names and types (a list
    option takes any sequence of its items)."""
    semantics: str
    estimator: str
    std_normalization: bool
    rewards_normalization: bool
    mainstream: str | None
    n_samples_per_prompt: int | None
    rollout_batch_size: int | None
    singleton_groups: str
    reward_keys: Sequence[str] | None
    reward_weights: Sequence[float] | None
    max_staleness: int | None
    current_version: int | None
    stale_rows: str
    zero_mask_units: str
    keep_band: str | None
    uniform_tolerance: float
    row_weight: str
    row_weight_scale: str
    turn_gamma: float | None
    norm_mean_type: str | None
    norm_std_type: str | None
    episode_reward_weight: float
    step_reward_weight: float
    std_ddof: int
    std_epsilon: float


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _check_choice(name: str, value, choices) -> None:
    """ValueError naming the option's flag and its choices when `value` is not one of them."""
    if value not in choices:
        raise ValueError(f"{_flag(name)} {value!r}: choose one of {', '.join(choices)}")


def _band_text(text) -> str:
    """`LO:HI` (numbers, LO <= HI; either may be -inf/inf) in one spelling, so that equal bands record alike."""
    if isinstance(text, (tuple, list)) and len(text) == 2:
        parts = [str(v) for v in text]
    else:
        parts = str(text).split(":")
    try:
        if len(parts) != 2:
            raise ValueError
        low, high = float(parts[0]), float(parts[1])
    except ValueError:
        raise ValueError(f"--keep-band {text!r}: expected LO:HI, two numbers (e.g. 0.1:0.9)") from None
    if math.isnan(low) or math.isnan(high) or low > high:
        raise ValueError(f"--keep-band {text!r}: expected LO <= HI")
    return f"{low!r}:{high!r}"
