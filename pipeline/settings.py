"""The run's settings: built once from RelabelOptions, plain values, picklable into DoFns."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from transforms.core.config import CoreConfig

if TYPE_CHECKING:
    from transforms.comparison import Side

PROJECT = "rollout-relabel"


def project_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(PROJECT)
    except PackageNotFoundError:
        return "0+unknown"


@dataclass(frozen=True)
class RunSettings:
    inputs: tuple[str, ...]
    output: str
    core: CoreConfig = field(default_factory=CoreConfig)
    reward_key: str | None = None
    drop_uniform_groups: bool = False
    device: str = "auto"
    fail_fast: bool = False
    max_dead_fraction: float | None = None
    overwrite: bool = False
    dry_run: bool = False
    core_resource_hints: tuple[tuple[str, str], ...] = ()
    progress: bool | None = None  # None: when stderr is a terminal
    version: str = field(default_factory=project_version)
    # the local runner's worker threads when ours to choose (the most to use), else None
    local_threads: int | None = None

    def semantics_record(self) -> dict:
        """What made every training row: goes into Parquet metadata and the manifest."""
        return {
            "project": PROJECT,
            "project_version": self.version,
            "semantics": self.core.semantics,
            "semantics_version": self.core.version,
            "estimator": self.core.estimator,
            "std_normalization": self.core.std_normalization,
            "rewards_normalization": self.core.rewards_normalization,
            "mainstream": self.core.mainstream,
            "n_samples_per_prompt": self.core.n_samples_per_prompt,
            "rollout_batch_size": self.core.rollout_batch_size,
            "reward_key": self.reward_key,
            "drop_uniform_groups": self.drop_uniform_groups,
        }

    def fingerprint(self) -> str:
        """Identifies the options that change output bytes (not device, not runner)."""
        from schemas import SCHEMA_VERSION
        record = dict(self.semantics_record(), schema_version=SCHEMA_VERSION)
        return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class CompareSettings:
    """`relabel compare`: the two labelings and where the report goes."""
    inputs: tuple[str, ...]
    report: str
    a: Side
    b: Side
    reward_key: str | None = None
    device: str = "auto"
    progress: bool | None = None
