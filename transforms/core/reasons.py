"""Stable reason codes for dead letters and filtered rows.

The core reports problems as small integers (index into REASONS) so that they
travel in tensors; readers, writers and the manifest use the strings.
"""

OK = 0
REASONS = (
    "",  # 0: no problem
    "missing-column",
    "non-numeric-reward",
    "non-finite-reward",
    "missing-reward-key",
    "negative-length",
    "mask-length",
    "duplicate-row",
    "partial-group-index",
    "group-sizes-mismatch",
    "batch-size-not-multiple",
    "missing-n-samples-per-prompt",
    "sibling-reward-mismatch",
    "non-finite-advantage",
    "unreadable-file",
    "unsafe-pickle",
    "empty-file",
    "ill-typed-column",
    "value-too-large",
    "late-batch-file",   # relabel watch: a file for a step already relabelled from other files
    "incomplete-group",  # row streams: a prompt group that did not complete before its timeout
    "null-mask-value",   # a null inside loss_mask: whether that token trains cannot be decided
    "duplicate-column",  # two columns share a name: which one is meant cannot be decided (whole file)
    "file-too-large",    # larger than --max-file-bytes: refused before it is read (whole file)
    # version 2 of the contract (SEMANTICS.md, "Estimators from the wider field")
    "passk-singleton-group",  # grpo_passk: a prompt group of one unit has no second value (unit: the group)
    "missing-baseline",       # remax: a unit's baseline is null, non-numeric or non-finite (unit: its group)
    "gdpo-too-few-tokens",    # gdpo: the batch's written rows have < 2 trainable tokens (unit: the batch)
    "malformed-line",         # a JSONL line that is not a JSON object (unit: the line alone)
    "mask-value",             # a loss_mask value other than 0 and 1: a token trains or it does not (unit: group)
    # version 3: rescoring (--reward-fn, --rm-url)
    REWARD_FAILED := "reward-failed",  # the verifier kept failing on the row, or answered no reward (unit: its group)
)
CODE = {name: i for i, name in enumerate(REASONS)}

UNIFORM_GROUP = "uniform-group"  # reason of filtered.parquet rows (not a dead letter)


class BadFile(Exception):
    """A whole input file cannot be used (unreadable, or its rows cannot be put in batches)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message
