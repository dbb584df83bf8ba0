"""AssembleGroups: rollout rows arriving one by one (a message bus) -> complete prompt groups.

Rows are keyed by (batch, prompt group) and held in state until their group
is complete, then emitted together: normalization needs the whole group.
How many rows a group has is known from
- the row itself: a `group_size` field (rows in its prompt group), or
- its batch's end marker: a message {"step": b, "end_of_batch": true,
  "group_sizes": {"<group_index>": rows, ...}} (slime/miles know every
  group's size when a step is done).
Rows and markers may arrive in any order. A group that is not complete
`timeout` seconds of event time after its first message goes, every row
held, to dead letters as `incomplete-group`; it is never normalized on
partial data. A row for a group already closed (emitted or timed out) is
dead-lettered too, naming what closed it; the group's state is dropped a
further `timeout` later (then a straggler opens a group that times out).
More rows than the declared size: `group-sizes-mismatch`, whole group.
Emitted rows are in a canonical order (`index`, then content), never
arrival order, so results do not depend on the bus.
"""
from __future__ import annotations

import json

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.coders import PickleCoder, StrUtf8Coder, VarIntCoder
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.utils.timestamp import Duration

from rollout_relabel import schemas
from rollout_relabel.transforms.core.reasons import Reason
from rollout_relabel.transforms.lib.output.stage_outputs import DEAD, GROUPS

STREAM_SOURCE = "stream"


def key_messages(message: dict, batch_field: str, group_field: str, size_field: str):
    """A row -> ((batch, group), ("row", row)) (+ its expected size); an end marker -> one expected size per
    group it names."""
    batch = message.get(batch_field)
    if message.get("end_of_batch"):
        for group, size in sorted((int(g), int(n)) for g, n in (message.get("group_sizes") or {}).items()):
            yield (batch, group), ("expect", size)
        return
    yield (batch, message.get(group_field)), ("row", message)
    if message.get(size_field) is not None:
        yield (batch, message.get(group_field)), ("expect", int(message[size_field]))


def canonical_order(rows: list[dict]) -> list[dict]:
    def key(row):
        index = row.get("index")
        return index is None, index if index is not None else 0, json.dumps(row, sort_keys=True, default=str)
    return sorted(rows, key=key)


def dead_rows_table(key, rows: list[dict], reason: str, message: str):
    """DEAD_LETTERS rows, one per message; `row` is the position in the group's canonical order."""
    import pyarrow as pa

    batch, group = key
    ordered = canonical_order(rows)
    return pa.table({
        "source": [STREAM_SOURCE] * len(ordered),
        "row": pa.array(range(len(ordered)), pa.int64()),
        "batch": [f"step={batch}"] * len(ordered),
        "reason": [reason] * len(ordered),
        "message": [f"{reason}: prompt group {group} of step={batch}: {message}"] * len(ordered),
        "row_json": [json.dumps(r, sort_keys=True, default=str) for r in ordered],
    }, schema=schemas.DEAD_LETTERS)


class CollectGroupFn(beam.DoFn):
    ROWS = BagStateSpec("rows", PickleCoder())
    COUNT = ReadModifyWriteStateSpec("count", VarIntCoder())
    EXPECTED = ReadModifyWriteStateSpec("expected", VarIntCoder())
    CLOSED = ReadModifyWriteStateSpec("closed", StrUtf8Coder())
    STARTED = ReadModifyWriteStateSpec("started", VarIntCoder())
    DEADLINE = TimerSpec("deadline", TimeDomain.WATERMARK)

    def __init__(self, timeout_seconds: float):
        self._timeout = Duration(seconds=timeout_seconds)

    def process(self, element, timestamp=beam.DoFn.TimestampParam,
                rows=beam.DoFn.StateParam(ROWS), count=beam.DoFn.StateParam(COUNT),
                expected=beam.DoFn.StateParam(EXPECTED), closed=beam.DoFn.StateParam(CLOSED),
                started=beam.DoFn.StateParam(STARTED), deadline=beam.DoFn.TimerParam(DEADLINE)):
        key, (kind, value) = element
        if closed.read() is not None:
            if kind == "row":
                yield pvalue.TaggedOutput(DEAD, dead_rows_table(key, [value], Reason.INCOMPLETE_GROUP,
                                                             f"a row arrived after the group was {closed.read()}"))
            return
        if not started.read():
            started.write(1)
            deadline.set(timestamp + self._timeout)
        if kind == "expect":
            if expected.read() is not None and expected.read() != value:
                yield from self._close(key, rows, count, closed, deadline, timestamp, Reason.GROUP_SIZES_MISMATCH,
                                       f"declared sizes disagree ({expected.read()} and {value} rows)")
                return
            expected.write(value)
        else:
            rows.add(value)
            count.write((count.read() or 0) + 1)
        have, want = count.read() or 0, expected.read()
        if want is None or have < want:
            return
        if have > want:
            yield from self._close(key, rows, count, closed, deadline, timestamp, Reason.GROUP_SIZES_MISMATCH,
                                   f"{have} rows arrived but the group's declared size is {want}")
            return
        yield key, canonical_order(list(rows.read()))
        rows.clear()
        count.clear()
        closed.write(f"emitted complete with {have} rows")
        deadline.set(timestamp + self._timeout)  # keep the closed flag a while for stragglers, then drop it

    def _close(self, key, rows, count, closed, deadline, timestamp, reason, message):
        held = list(rows.read())
        if held:
            yield pvalue.TaggedOutput(DEAD, dead_rows_table(key, held, reason, message))
        rows.clear()
        count.clear()
        closed.write(f"dead-lettered ({reason})")
        deadline.set(timestamp + self._timeout)

    @on_timer(DEADLINE)
    def expire(self, key=beam.DoFn.KeyParam, fired=beam.DoFn.TimestampParam,
               rows=beam.DoFn.StateParam(ROWS), count=beam.DoFn.StateParam(COUNT),
               expected=beam.DoFn.StateParam(EXPECTED), closed=beam.DoFn.StateParam(CLOSED),
               started=beam.DoFn.StateParam(STARTED), deadline=beam.DoFn.TimerParam(DEADLINE)):
        if closed.read() is not None:  # the straggler window has passed: forget the group
            for state in (rows, count, expected, closed, started):
                state.clear()
            return
        want = expected.read()
        have = count.read() or 0
        size = f"{have} of {want} rows" if want is not None else f"{have} rows (size never declared)"
        yield from self._close(key, rows, count, closed, deadline, fired, Reason.INCOMPLETE_GROUP,
                               f"{size} arrived within the {self._timeout.micros / 1e6:g} s timeout")


class AssembleGroups(beam.PTransform):
    """PCollection[message dict] -> groups (main: ((batch, group), [row dicts])) / dead (DEAD_LETTERS tables)."""

    def __init__(self, timeout_seconds: float, batch_field: str = "step", group_field: str = "group_index",
                 size_field: str = "group_size"):
        super().__init__()
        if timeout_seconds <= 0:
            raise ValueError(f"timeout_seconds must be positive, got {timeout_seconds}")
        self._timeout = timeout_seconds
        self._fields = (batch_field, group_field, size_field)

    def expand(self, messages):
        return (messages
                | "KeyByGroup" >> beam.FlatMap(key_messages, *self._fields)
                | "CollectUntilComplete" >> beam.ParDo(CollectGroupFn(self._timeout)).with_outputs(DEAD, main=GROUPS))
