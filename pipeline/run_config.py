"""Run configs (run_configs/*.yaml): option values that the command line overrides."""
from __future__ import annotations

import argparse

import yaml

from pipeline.options import UsageError, full_parser


def config_argv(path: str) -> list[str]:
    """The config's options as argv flags, to be placed before the command line's own.

    Keys are option names with dashes or underscores (`n_samples_per_prompt`,
    `runner`, `direct_running_mode`); an unknown key is an error naming it.
    """
    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle) or {}
    except (OSError, yaml.YAMLError) as error:
        raise UsageError(f"--config {path}: {error}") from error
    if not isinstance(data, dict):
        raise UsageError(f"--config {path}: expected a mapping of option names to values")
    actions = {}
    for action in full_parser("any")._actions:  # noqa: SLF001
        for flag in action.option_strings:
            if flag.startswith("--") and not flag.startswith("--no-"):
                actions.setdefault(flag[2:].replace("-", "_"), (flag, action))
        actions.setdefault(action.dest, (action.option_strings[0] if action.option_strings else None, action))
    argv = []
    for key, value in data.items():
        found = actions.get(str(key).replace("-", "_"))
        if found is None or found[0] is None:
            raise UsageError(f"--config {path}: unknown key {key!r}")
        flag, action = found
        argv += _flags(flag, action, value, path, key)
    return argv


def _flags(flag, action, value, path, key):
    if isinstance(action, argparse.BooleanOptionalAction):
        positive = next(f for f in action.option_strings if not f.startswith("--no-"))
        return [positive if value else "--no-" + positive[2:]]
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):  # noqa: SLF001
        if not isinstance(value, bool):
            raise UsageError(f"--config {path}: {key} takes true or false, got {value!r}")
        # a store_false flag like --no-rewards-normalization is named by its dest
        wanted = value if isinstance(action, argparse._StoreTrueAction) else not value  # noqa: SLF001
        return [flag] if wanted else []
    if value is None:
        return []
    if isinstance(value, list):
        return [f"{flag}={item}" for item in value]
    if isinstance(value, dict):
        import json
        return [f"{flag}={json.dumps(value)}"]
    return [f"{flag}={value}"]


def expand_config(argv: list[str]) -> list[str]:
    """argv with each `--config FILE` replaced by the file's flags, placed first (the command line wins)."""
    rest, configs, i = [], [], 0
    while i < len(argv):
        if argv[i] == "--config":
            if i + 1 >= len(argv):
                raise UsageError("--config needs a file")
            configs.append(argv[i + 1])
            i += 2
            continue
        if argv[i].startswith("--config="):
            configs.append(argv[i].split("=", 1)[1])
        else:
            rest.append(argv[i])
        i += 1
    return [flag for path in configs for flag in config_argv(path)] + rest
