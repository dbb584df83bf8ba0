"""--format: the rollout dumps of other frameworks, as a reader, a column mapping, a batch rule and the
framework's own default semantics options. Each preset is a list of flags placed before the command line's
(as a run config's are), so any of them can be overridden; they are recorded in the lineage as those flags.

The writers each preset follows, field for field, are cited in docs/formats.md.
"""
from __future__ import annotations

from rollout_relabel.transforms.lib.errors import UsageError

PRESETS: dict[str, list[str]] = {
    # our own layouts: slime / miles .pt dumps are read as they are; a sample's weight versions (one per turn)
    # are read under --max-staleness
    "slime": ["--version-column=weight_versions"],
    "miles": ["--version-column=weight_versions"],
    # verl `_write_generations` ({step}.jsonl, one line per response; v1 trainer: uid = {uid}_{session}_{index}),
    # verl's GRPO: rows of one uid, mean and std (ddof 1) over them, eps 1e-6, a one-row group (0 - 0) / (1 + eps)
    "verl": ["--column=reward=score", "--column=group_index=uid", "--group-key=verl-uid",
             "--batch-from=file", "--semantics=group-index", "--singleton-groups=raw"],
    # AReaL `_dump_trajectory` (.../{version}/{task_id}.jsonl: one file per prompt group, one folder per version)
    "areal": ["--column=group_index=task_id", "--batch-from=folder", "--semantics=group-index",
              "--version-column=head_version"],
    # NeMo-RL train_data_step{N}.jsonl: every value wrapped in a 1-element list; groups are consecutive blocks of
    # num_generations_per_prompt (16) rows; GRPOAdvantageEstimator's defaults: leave-one-out baseline and std
    "nemo-rl": ["--column=reward=rewards.0", "--column=response_length=input_lengths.0", "--batch-from=file",
                "--semantics=group-index", "--n-samples-per-prompt=16", "--estimator=grpo_loo"],
    # TRL completions_{step:05d}.parquet: `step`, one column per reward function (name it: --column reward=NAME),
    # `advantage`; groups are consecutive slices of num_generations (8); mean and std (ddof 1) per group
    "trl": ["--semantics=group-index", "--n-samples-per-prompt=8"],
}


# `relabel compare`: the preset's stored advantage is side A unless --a is given (--a column:NAME)
STORED_ADVANTAGE: dict[str, str] = {
    "nemo-rl": "advantages.0.0",   # the advantage repeated at every token: the first token's
    "trl": "advantage",
}


def expand_format(argv: list[str], command: str | None = None) -> list[str]:
    """argv with `--format X` replaced by the preset's flags, placed first (the command line wins); for
    `compare`, a preset with a stored advantage adds `--a column:NAME` (a later --a wins)."""
    rest, presets, i = [], [], 0
    while i < len(argv):
        token = argv[i]
        if token == "--format" or token.startswith("--format="):
            if token == "--format":
                if i + 1 >= len(argv):
                    raise UsageError("--format needs a name: " + ", ".join(PRESETS))
                name, i = argv[i + 1], i + 2
            else:
                name, i = token.split("=", 1)[1], i + 1
            if name not in PRESETS:
                raise UsageError(f"--format {name!r}: expected one of {', '.join(PRESETS)}")
            presets += PRESETS[name]
            if command == "compare" and name in STORED_ADVANTAGE:
                presets.append(f"--a=column:{STORED_ADVANTAGE[name]}")
            continue
        rest.append(token)
        i += 1
    # a --column of the command line (or of a run config) replaces the preset's for the same NAME
    given = {_column_name(rest[j], rest[j + 1] if j + 1 < len(rest) else "") for j in range(len(rest))} - {None}
    presets = [flag for flag in presets if _column_name(flag, "") not in given]
    return presets + rest


def _column_name(token: str, following: str) -> str | None:
    """The NAME of a `--column=NAME=SOURCE` (or `--column NAME=SOURCE`: `following` is its value)."""
    if token.startswith("--column="):
        return token[len("--column="):].partition("=")[0].strip()
    if token == "--column" and "=" in following:
        return following.partition("=")[0].strip()
    return None
