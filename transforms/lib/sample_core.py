"""Live slime / miles Sample objects -> the numeric core's CoreInput, with no Arrow (and no Beam).

The reward hooks (rollout_relabel/hooks/) run inside the trainer on the
samples of one step. They read the same things slim.py reads from a dump's
columns (reward value, trainable tokens, group and rollout keys) and find the
same row problems, with the same reason codes and messages, straight from the
objects' attributes. The texts of the row problems are defined here once and
used by slim.py too; tests/transforms/lib/test_sample_core.py holds the two
paths equal on random samples.

Where slim.py decides by a column's Arrow type (a reward column of dicts, a
float group_index), this module infers the type Arrow would give the same
Python values, so a field of the wrong kind is refused for every row, as
`relabel run` refuses the dump's column. One case is left out: bools mixed
with numbers in one field, which Arrow types by the order they come in.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from transforms.core.reasons import CODE
from transforms.core.types import CoreInput

# A response longer than this is not a real rollout; building its mask would exhaust memory.
MAX_RESPONSE_TOKENS = 1 << 24
# the interpreted fields, in the order of Sample's fields (and so of a dump's columns)
FIELD_ORDER = ("group_index", "index", "rollout_id", "response_length", "loss_mask", "remove_sample")


# --- the texts of row problems (slim.py says the same) ------------------------------------------------------

def ill_typed_text(name, kind, expected) -> str:
    return f"column `{name}` has type {kind}, expected {expected}"


def negative_length_text(length) -> str:
    return f"response_length is {length}"


def too_large_text(tokens) -> str:
    return f"response of {tokens} tokens is over the {MAX_RESPONSE_TOKENS} limit"


def mask_length_text(mask_len, length) -> str:
    return f"len(loss_mask) is {mask_len} but response_length is {length}"


def null_mask_text(nulls, mask_len) -> str:
    return f"loss_mask holds {nulls} null value(s) among its {mask_len}"


def reward_type_text(kind, reward_key) -> str:
    """non-numeric-reward / missing-reward-key for the whole reward column."""
    if reward_key is None:
        hint = "; pass --reward-key to pick a field" if kind.startswith(("struct<", "map<")) else ""
        return f"reward has type {kind}{hint}"
    return f"--reward-key {reward_key!r} given but reward has type {kind}"


# --- the adapter ----------------------------------------------------------------------------------------------

@dataclass
class SampleRows:
    """One step's samples as the core sees them, and what was wrong with them."""
    core: CoreInput
    reward: np.ndarray          # float64 reward values (0 where a row has a problem)
    details: dict[int, str]     # row -> the text of its problem


def rows_from_samples(samples, reward_key: str | None = None) -> SampleRows:
    """The core's input for one batch of Sample-like objects (attributes as slime / miles Sample has them)."""
    n = len(samples)
    problem = np.zeros(n, dtype=np.int64)
    details: dict[int, str] = {}

    def flag(rows, reason, describe):
        for i in rows:
            if problem[i] == 0:
                problem[i] = CODE[reason]
                details[i] = describe(i)

    # as slim.py's usable_columns, in the fields' order: a column of the wrong type is refused whole
    ints = {}
    masks = [getattr(s, "loss_mask", None) for s in samples]
    removes = [getattr(s, "remove_sample", None) for s in samples]
    mask_len, mask_sum, nulls, mask_kind = _mask_stats(masks)
    for name in FIELD_ORDER:
        if name == "loss_mask":
            if mask_kind is not None:
                flag(range(n), "ill-typed-column",
                     lambda i: ill_typed_text("loss_mask", mask_kind, "a list of integers"))
                masks, mask_len, mask_sum, nulls = [None] * n, [0] * n, [0] * n, [0] * n
            continue
        if name == "remove_sample":
            kind = arrow_type(removes)
            if kind not in ("bool", "null"):
                flag(range(n), "ill-typed-column",
                     lambda i, kind=kind: ill_typed_text("remove_sample", kind, "booleans"))
                removes = [None] * n
            continue
        values = [getattr(s, name, None) for s in samples]
        kind = arrow_type(values)
        if kind == "null":
            values = [None] * n
        elif kind == "double" and _integral(values):
            values = [None if v is None else int(v) for v in values]
        elif kind != "int64":
            flag(range(n), "ill-typed-column", lambda i, name=name, kind=kind: ill_typed_text(name, kind, "integers"))
            values = [None] * n
        ints[name] = values

    if n and not any(hasattr(s, "reward") for s in samples):
        flag(range(n), "missing-column", lambda i: "the file has no `reward` column")
        reward = np.zeros(n)
    else:
        reward = _reward_values([getattr(s, "reward", None) for s in samples], reward_key, flag)

    has_mask = [m is not None for m in masks]
    length = [r if r is not None else ml for r, ml in zip(ints["response_length"], mask_len)]
    given = [r is not None for r in ints["response_length"]]
    flag([i for i in range(n) if given[i] and length[i] < 0], "negative-length",
         lambda i: negative_length_text(length[i]))
    flag([i for i in range(n) if length[i] > MAX_RESPONSE_TOKENS or mask_len[i] > MAX_RESPONSE_TOKENS],
         "value-too-large", lambda i: too_large_text(max(length[i], mask_len[i])))
    flag([i for i in range(n) if has_mask[i] and given[i] and mask_len[i] != length[i]], "mask-length",
         lambda i: mask_length_text(mask_len[i], length[i]))
    flag([i for i in range(n) if has_mask[i] and nulls[i]], "null-mask-value",
         lambda i: null_mask_text(nulls[i], mask_len[i]))
    trainable = np.array([0 if rm else (ms if hm else max(ln, 0))
                          for rm, hm, ms, ln in zip(removes, has_mask, mask_sum, length)], dtype=np.int64)

    rollout_id, index, group = ints["rollout_id"], ints["index"], ints["group_index"]
    key = [r if r is not None else x for r, x in zip(rollout_id, index)]
    reward = np.where(problem == 0, reward, 0.0)
    core = CoreInput(
        batch=np.zeros(n, dtype=np.int64),
        reward=reward,
        trainable=trainable,
        mask_sum=trainable,
        group_index=np.array([0 if g is None else g for g in group], dtype=np.int64),
        has_group_index=np.array([g is not None for g in group], dtype=bool),
        rollout_key=np.array([0 if k is None else k for k in key], dtype=np.int64),
        has_rollout_key=np.array([k is not None for k in key], dtype=bool),
        row_problem=problem,
        num_batches=1,
        prompt_group_sizes=[None],
    )
    return SampleRows(core, reward, details)


def _mask_stats(masks):
    """Per mask: length, sum (nulls as 0), null count; and the mask column's type when it is not integers.

    One sum() per mask, as the trainer's own rollout_mask_sums: the masks are walked once. Only when a
    mask looks odd (a float sum, bools, not a list) is the column's type inferred, walking every mask.
    """
    n = len(masks)
    lengths, sums, nulls = [0] * n, [0] * n, [0] * n
    odd = False
    for i, mask in enumerate(masks):
        if mask is None:
            continue
        if type(mask) is not list:
            odd = True
            continue
        lengths[i] = len(mask)
        try:
            total = sum(mask)
        except TypeError:  # a None (null) among the values, or not numbers at all
            nulls[i] = sum(v is None for v in mask)
            try:
                total = sum(v for v in mask if v is not None)
            except TypeError:
                odd = True
                continue
        if type(total) is not int or (mask and type(mask[0]) is bool):
            odd = True
        sums[i] = total
    kind = arrow_type(masks) if odd else None
    return lengths, sums, nulls, None if kind in (None, "list<item: int64>", "null") else kind


def _reward_values(rewards, reward_key, flag) -> np.ndarray:
    """The reward value of each row as slim.py's _reward_values finds it, problems flagged."""
    n = len(rewards)
    everyone = range(n)
    kind = arrow_type(rewards)
    if reward_key is None:
        if kind not in ("int64", "double"):
            flag(everyone, "non-numeric-reward", lambda i: reward_type_text(kind, None))
            return np.zeros(n)
        values = rewards
    elif kind.startswith("struct<"):
        names = list(dict.fromkeys(k for r in rewards if r is not None for k in r))
        if reward_key not in names:
            flag(everyone, "missing-reward-key",
                 lambda i: f"reward struct has no field {reward_key!r} (fields: {', '.join(names)})")
            return np.zeros(n)
        values = [None if r is None else r.get(reward_key) for r in rewards]
        flag([i for i in everyone if rewards[i] is not None and values[i] is None], "missing-reward-key",
             lambda i: f"reward[{reward_key!r}] is null")
        inner = arrow_type(values)
        if inner not in ("int64", "double"):
            flag(everyone, "non-numeric-reward", lambda i: f"reward[{reward_key!r}] has type {inner}")
            return np.zeros(n)
    else:
        flag(everyone, "missing-reward-key", lambda i: reward_type_text(kind, reward_key))
        return np.zeros(n)
    numbers = np.array([math.nan if v is None else float(v) for v in values], dtype=np.float64)
    flag([i for i in everyone if rewards[i] is None], "non-numeric-reward", lambda i: "reward is null")
    flag(np.flatnonzero(~np.isfinite(numbers)), "non-finite-reward", lambda i: f"reward is {numbers[i]}")
    return numbers


def _integral(values) -> bool:
    present = [v for v in values if v is not None]
    return all(math.isfinite(v) and v == round(v) for v in present) and (
        not present or max(abs(v) for v in present) < 2 ** 53)


# --- the type Arrow infers for a column of Python values ----------------------------------------------------

_NAMES = {type(None): "null", bool: "bool", int: "int64", float: "double", str: "string", bytes: "binary"}


def _scalar_name(kinds) -> str:
    kinds = set(kinds)
    if kinds <= {int, float} and kinds:
        return "double" if float in kinds else "int64"
    return _NAMES.get(next(iter(kinds)), "string") if len(kinds) == 1 else "null" if not kinds else "string"


def arrow_type(values) -> str:
    """The name of the type pa.array(values) gives, with samples.py's rule: a column Arrow cannot type
    (mixed kinds, an empty struct) is JSON text, "string". Covers scalars, dicts and lists."""
    kinds = {type(v) for v in values} - {type(None)}
    if not kinds:
        return "null"
    if kinds <= set(_NAMES):
        return _scalar_name(kinds) if not (bool in kinds and len(kinds) > 1) else "string"
    if kinds == {dict}:
        present = [v for v in values if v is not None]
        names = list(dict.fromkeys(k for v in present for k in v))
        if not names or not all(type(k) is str for k in names):
            return "string"
        fields = [(k, arrow_type([v.get(k) for v in present])) for k in names]
        if any(kind == "string" and not _all_strings([v.get(k) for v in present]) for k, kind in fields):
            return "string"
        return "struct<" + ", ".join(f"{k}: {kind}" for k, kind in fields) + ">"
    if kinds == {list}:
        item = arrow_type([x for v in values if v is not None for x in v])
        if item == "string" and not _all_strings([x for v in values if v is not None for x in v]):
            return "string"
        return f"list<item: {item}>"
    return "string"


def _all_strings(values) -> bool:
    return all(v is None or type(v) is str for v in values)
