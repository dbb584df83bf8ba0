"""--format NAME: the flags a framework's format stands for (its preset: a column mapping, a batch rule, the
framework's own default semantics options), placed before the command line's (as a run config's are), so
any of them can be overridden; they are recorded in the lineage as those flags.

The presets live with their formats (transforms/lib/io/formats/, one module each); the writers each
follows, field for field, are cited in docs/formats.md.
"""
from __future__ import annotations

from rollout_relabel.transforms.lib.errors import UsageError
from rollout_relabel.transforms.lib.io import formats

RESCORING_FLAGS = ("--reward-fn", "--rm-url", "--reward-model")


def expand_format(argv: list[str], command: str | None = None) -> list[str]:
    """argv with `--format X` replaced by the preset's flags, placed first (the command line wins); for
    `compare`, a preset with a stored advantage adds `--a column:NAME` (a later --a wins)."""
    rest, presets, refusals, i = [], [], [], 0
    while i < len(argv):
        token = argv[i]
        if token == "--format" or token.startswith("--format="):
            if token == "--format":
                if i + 1 >= len(argv):
                    raise UsageError("--format needs a name: " + ", ".join(formats.preset_names()))
                name, i = argv[i + 1], i + 2
            else:
                name, i = token.split("=", 1)[1], i + 1
            found = formats.by_name(name)
            if found is None or not found.preset:
                raise UsageError(f"--format {name!r}: expected one of {', '.join(formats.preset_names())}")
            presets += found.preset
            if found.no_rescoring is not None:
                refusals.append((name, found.no_rescoring))
            if command == "compare" and found.stored_advantage is not None:
                presets.append(f"--a=column:{found.stored_advantage}")
            continue
        rest.append(token)
        i += 1
    rescoring = next((t.split("=", 1)[0] for t in rest if t.split("=", 1)[0] in RESCORING_FLAGS), None)
    if rescoring is not None and refusals:
        name, why = refusals[0]
        raise UsageError(f"--format {name} cannot take {rescoring}: {why}")
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
