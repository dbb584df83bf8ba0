"""Run configs (run_configs/*.yaml): option values that the command line overrides.

A config's keys are the command's own option names (dashes or underscores:
`n_samples_per_prompt`, `reward-key`) or Beam pipeline options (`runner`,
`direct_running_mode`); an unknown key is an error naming it. Each key
becomes flags placed before the command line's, so the command line wins.
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import yaml

from rollout_relabel.transforms.lib.errors import UsageError


def config_argv(path: str, parser, beam: set[str]) -> list[str]:
    """The config's options as argv flags for `parser` (a rollout_relabel.pipeline.flags.Parser) and for Beam
    (`beam`: the names of the pipeline options Beam knows)."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle) or {}
    except (OSError, yaml.YAMLError) as error:
        raise UsageError(f"--config {path}: {error}") from error
    if not isinstance(data, dict):
        raise UsageError(f"--config {path}: expected a mapping of option names to values")
    by_dest, by_flag = {}, {}
    for action in parser.declared:
        by_dest.setdefault(action.dest, action)
        for flag in action.option_strings:
            by_flag.setdefault(_name(flag), (flag, action))
    argv = []
    for key, value in data.items():
        name = _name(str(key))
        if name in by_flag:
            argv += _our_flags(*by_flag[name], value, path, key, by_name=True)
        elif name in by_dest:
            action = by_dest[name]
            argv += _our_flags(action.option_strings[0], action, value, path, key, by_name=False)
        elif name in beam:
            argv += _beam_flags(name, value)
        else:
            raise UsageError(f"--config {path}: unknown key {key!r}")
    return argv


def _name(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def _our_flags(flag: str, action: argparse.Action, value, path: str, key, by_name: bool) -> list[str]:
    if isinstance(action, argparse.BooleanOptionalAction):
        _need_bool(value, path, key)
        positive = next(f for f in action.option_strings if not f.startswith("--no-"))
        return [positive if value else "--no-" + positive[2:]]
    if action.nargs == 0:  # a switch: store_true (const True) or store_false (const False)
        _need_bool(value, path, key)
        # named by its flag (`no_rewards_normalization: true`) it is on when true; by its dest
        # (`rewards_normalization: false`) when the value is the one the switch stores
        return [flag] if (value if by_name else value == action.const) else []
    if value is None:
        return []
    if isinstance(value, list):
        return [f"{flag}={item}" for item in value]
    if isinstance(value, dict):  # `columns: {reward: score}` -> --column reward=score
        return [f"{flag}={k}={v}" for k, v in value.items()]
    return [f"{flag}={value}"]


def _need_bool(value, path, key) -> None:
    if not isinstance(value, bool):  # YAML's quoted "false" is a string: never read as true
        raise UsageError(f"--config {path}: {key} takes true or false, got {value!r}")


def _beam_flags(name: str, value) -> list[str]:
    """As Beam's PipelineOptions.from_dictionary spells values: switches bare, lists repeated, dicts as JSON."""
    if value is None or value is False:
        return []
    if value is True:
        return [f"--{name}"]
    if isinstance(value, list):
        return [f"--{name}={item}" for item in value]
    if isinstance(value, dict):
        return [f"--{name}={json.dumps(value)}"]
    return [f"--{name}={value}"]


def expand_config(argv: list[str], parser, beam: Callable[[], set[str]]) -> list[str]:
    """argv with each `--config FILE` replaced by the file's flags, placed first (the command line wins).

    `beam()`: the names of the pipeline options Beam knows, asked only when there is a config (listing
    them builds Beam's whole option parser: start-up time every run would pay)."""
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
    if not configs:
        return rest
    known = beam()
    return [flag for path in configs for flag in config_argv(path, parser, known)] + rest
