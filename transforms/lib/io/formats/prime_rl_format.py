"""prime-rl's episode files: its `FileMonitor.log_episodes` (PrimeIntellect-ai/prime-rl,
src/prime_rl/monitors/file.py at 559b44772e471d1538537b8805cc77f3824a5e64) appends one JSON line per episode,
the `Episode.to_record()` of the verifiers library it pins (PrimeIntellect-ai/verifiers, verifiers/v1/episode.py
and trace.py at a60a606ecc4d309247edf9ff92c3eabca362781f), to
`{output_dir}/rollouts/step_{N}/{train,eval}/{all,effective}/traces.jsonl`.

`effective/` holds, at the step that trained them, the traces the trainer was sent (admitted, clean,
trainable: prime_rl/orchestrator/metrics.py `TrainEpisodes.effective`); `all/` holds every episode as it
arrived. A trace is a message graph (`nodes`, each with its `parent`); its branches are the paths from a root
to each leaf (a node no node names as parent), in leaf order (verifiers/v1/graph.py `leaves`), and each
branch is one row. Training rows come from `effective/`; `all/` is read only for the traces no `effective/`
file of the run holds, whose rows are marked `not_trained` with the reason. `eval/` is never trained on: a
listing holding train files leaves it out.

prime-rl's GRPO (prime_rl/orchestrator/algo/grpo.py, base.py `iter_trainable_traces`): over the trainable
traces of one rollout group (`episode.group.id`), the trace's reward (the sum of its rewards' score x weight)
minus the group's mean, in float32, no std; one value for every sampled token of the trace. A branch's
training mask is its sampled tokens, a sampled node shared with an earlier branch trained there only
(prime_rl/orchestrator/trajectories.py `iter_trainable_branches`); a branch left with none is not trained.
A group is scored when it completes, before the trainer's batches are cut, so its traces may be trained at
two steps: the batch here is the step the group was dispatched at (`run.work.step`), which all its
episodes share.
"""
from __future__ import annotations

import io
import json
import re
import threading
from collections.abc import Sequence
from typing import Generic, TypeVar

import msgspec
import numpy as np
import pyarrow as pa
from pyarrow import csv

from rollout_relabel.transforms.core.reasons import Reason
from rollout_relabel.transforms.lib.errors import BadFile
from rollout_relabel.transforms.lib.io import filesystem
from rollout_relabel.transforms.lib.io.formats.format import Footer, Format, ReadOptions, read_bytes, steps_in
from rollout_relabel.transforms.lib.io.jsonl import MALFORMED_LINES, MALFORMED_TEXTS

# {rollouts}/step_{N}/train/{all,effective}/traces.jsonl (monitors/file.py); group 1: the rollouts folder
PATTERN = re.compile(r"(^|.*/)step_(\d+)/train/(all|effective)/traces\.jsonl$")
EVALUATION = re.compile(r"(^|.*/)step_\d+/eval/(?:all|effective)/traces\.jsonl$")

TEXT_COLUMNS = ("messages", "task")      # JSON text, built only when asked for
TOKEN_COLUMNS = ("token_ids", "loss_mask", "logprobs")
SCHEMA = pa.schema([
    ("step", pa.int64()), ("rollouts_step", pa.int64()), ("subset", pa.string()), ("episode_id", pa.string()),
    ("group_index", pa.string()), ("env_id", pa.string()), ("env_name", pa.string()), ("trace_id", pa.string()),
    ("branch_index", pa.int64()), ("rollout_id", pa.string()), ("agent", pa.string()), ("trainable", pa.bool_()),
    ("ok", pa.bool_()), ("stop_condition", pa.string()), ("reward", pa.float64()), ("rewards", pa.string()),
    ("metrics", pa.string()), ("policy_start", pa.int64()), ("policy_end", pa.int64()),
    ("prime_rl_advantage", pa.float64()), ("token_ids", pa.list_(pa.int64())), ("loss_mask", pa.list_(pa.int8())),
    ("logprobs", pa.list_(pa.float32())), ("messages", pa.string()), ("task", pa.string()),
    ("not_trained", pa.string()),
])
# all/ only: the curriculum rejected its group, it went stale, its advantage was 0, or it never shipped
NOT_IN_EFFECTIVE = "not in any effective/ file"
NO_TRAINABLE_TOKEN = "branch has no trainable token"


class Malformed(ValueError):
    """A line that is not a prime-rl episode record: why, for its dead letter."""


class _Unparsed(Exception):
    """A node's list that the one-pass parse could not read: a value of another type, or beyond its type's range."""


# The record's fields the rows need: msgspec reads a line straight into them and skips every other field unread.
# A node's per-token lists stay JSON text there (msgspec checks their syntax) and `_NodeLists` parses those of
# every node of a file at once, in C; only when that fails is each line decoded again with the lists typed
# (`TypedNode`), whose error names the path of a value of another type ($.traces[0].nodes[3].mask[0]).
# Defaults are the record's (verifiers' models), whose null fields the writer leaves out.
def _null() -> msgspec.Raw:
    return msgspec.Raw(b"null")


def _empty() -> msgspec.Raw:
    return msgspec.Raw(b"[]")


NULL, EMPTY = _null(), _empty()


class Node(msgspec.Struct, gc=False):
    parent: int | None = None
    message: msgspec.Raw = msgspec.field(default_factory=_null)  # kept as its JSON text
    sampled: bool = False
    token_ids: msgspec.Raw = msgspec.field(default_factory=_empty)   # list[int]
    mask: msgspec.Raw = msgspec.field(default_factory=_empty)        # list[bool]
    logprobs: msgspec.Raw = msgspec.field(default_factory=_empty)    # list[float], over the sampled tokens
    advantages: msgspec.Raw = msgspec.field(default_factory=_null)   # list[float] | None, the same, once scored


class TypedNode(msgspec.Struct, gc=False):
    """A node with its lists typed: decoded only to name what is wrong in a line the one-pass parse refused."""
    parent: int | None = None
    message: msgspec.Raw = msgspec.field(default_factory=_null)
    sampled: bool = False
    token_ids: list[int] = []
    mask: list[bool] = []
    logprobs: list[float] = []
    advantages: list[float] | None = None


AnyNode = TypeVar("AnyNode", Node, TypedNode)


class RewardValue(msgspec.Struct, gc=False):
    score: float
    weight: float = 1.0


class Agent(msgspec.Struct, gc=False):
    name: str = "agent"
    trainable: bool = True


class TraceError(msgspec.Struct, gc=False):
    type: str | None = None


class TraceRecord(msgspec.Struct, Generic[AnyNode], gc=False):
    id: str
    task: msgspec.Raw = msgspec.field(default_factory=_null)
    agent: Agent = msgspec.field(default_factory=Agent)
    nodes: list[AnyNode] = []
    rewards: dict[str, RewardValue | None] = {}
    metrics: msgspec.Raw = msgspec.field(default_factory=_null)
    ok: bool = False
    stop_condition: str | None = None
    errors: list[TraceError] = []


class Group(msgspec.Struct, gc=False):
    id: str


class Policy(msgspec.Struct, gc=False):
    start: int | None = None
    end: int | None = None


class Work(msgspec.Struct, gc=False):
    step: int | None = None
    policy: Policy | None = None


class Run(msgspec.Struct, gc=False):
    work: Work | None = None


class Env(msgspec.Struct, gc=False):
    id: str | None = None
    name: str | None = None


class EpisodeRecord(msgspec.Struct, Generic[AnyNode], gc=False):
    id: str | None = None
    env: Env | None = None
    group: Group | None = None
    run: Run | None = None
    traces: list[TraceRecord[AnyNode]] = []


class TraceId(msgspec.Struct, gc=False):
    id: str


class EpisodeIds(msgspec.Struct, gc=False):
    traces: list[TraceId] = []


EPISODE = msgspec.json.Decoder(EpisodeRecord[Node])
TYPED = msgspec.json.Decoder(EpisodeRecord[TypedNode])
IDS = msgspec.json.Decoder(EpisodeIds)


def _posix(path: str) -> str:
    return path.replace("\\", "/")


def matches(path: str) -> bool:
    return PATTERN.match(_posix(path)) is not None


def companions(listing: Sequence[str]) -> set[str]:
    """The eval files (never trained on) of every rollouts folder holding train files."""
    roots = {m.group(1) for p in listing if (m := PATTERN.match(_posix(p)))}
    return {p for p in listing if (m := EVALUATION.match(_posix(p))) and m.group(1) in roots}


class _Trained:
    """The ids of the traces a run's effective/ files hold, kept per process: each file is parsed once, again
    only when its size or time changes, so the all/ files of a long run share one set."""

    def __init__(self) -> None:
        self.files: dict[str, tuple[tuple[int, float], frozenset[str]]] = {}
        self.ids: frozenset[str] = frozenset()

    def update(self, rollouts: str) -> frozenset[str]:
        listed = filesystem.match_in(rollouts.rstrip("/") or ".", "step_*/train/effective/traces.jsonl")
        stamps = {m.path: (int(m.size_in_bytes), float(m.last_updated_in_seconds)) for m in listed
                  if PATTERN.match(_posix(m.path))}
        if {p: known[0] for p, known in self.files.items()} != stamps:
            self.files = {p: self.files[p] if p in self.files and self.files[p][0] == stamp else (stamp, _ids(p))
                          for p, stamp in stamps.items()}
            self.ids = frozenset().union(*(ids for _, ids in self.files.values()))
        return self.ids


def _ids(path: str) -> frozenset[str]:
    ids: set[str] = set()
    for line in read_bytes(path).splitlines():
        try:
            ids.update(t.id for t in IDS.decode(line).traces)
        except (msgspec.DecodeError, RecursionError):
            continue  # a blank line; a bad one is reported by the file's own read
    return frozenset(ids)


_RUNS: dict[str, _Trained] = {}  # rollouts folder -> what its effective/ files hold
_RUNS_LOCK = threading.Lock()    # a local run reads files on several threads


def _trained_ids(rollouts: str) -> frozenset[str]:
    """The ids of the traces any `effective/` file of the run holds: the trainer was sent them."""
    with _RUNS_LOCK:
        return _RUNS.setdefault(rollouts, _Trained()).update(rollouts)


def _raw_text(raw: msgspec.Raw) -> str | None:
    text = bytes(raw).decode()
    return None if text == "null" else text


def _reward(trace: TraceRecord) -> float:
    """Trace.reward: the sum of score x weight over the rewards that ran (a null one did not)."""
    return sum(r.score * r.weight for r in trace.rewards.values() if r is not None)


# A node's list, valid JSON (msgspec checked it), holding only these characters besides brackets and commas,
# holds only values of the type: JSON writes no other number or boolean.
CHARACTERS = {"int": b"-0123456789", "float": b"-+.0123456789eE", "bool": b"truefals"}
WHITESPACE = b" \t"  # the JSON whitespace a line can hold (it holds no line break)
ONE_A_LINE = bytes.maketrans(b",]", b"\n\n")  # with "[" deleted: one number a line (a list's end a blank one)
CSV_TYPES = {"int": pa.int64(), "float": pa.float64()}


def _starts(counts: np.ndarray) -> np.ndarray:
    """Where each of consecutive runs of `counts` values begins."""
    return np.cumsum(counts) - counts


def _lists(raws: Sequence[msgspec.Raw | bytes], kind: str, values: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Nodes' JSON lists (one a node) parsed at once: how many values each holds, and all values one after
    another (none unless `values`). _Unparsed when one is not a flat list of the kind's values, or a value is
    beyond its type."""
    text = b"".join(raws)
    if b" " in text or b"\t" in text:
        raws = [bytes(r).translate(None, WHITESPACE) for r in raws]
        text = b"".join(raws)
    codes = np.frombuffer(text, np.uint8)
    lengths = np.fromiter(map(len, raws), np.int64, len(raws))
    closes = np.cumsum(lengths) - 1
    opens = closes - lengths + 1
    # one flat list of the kind's values a node: each node's text opens and closes one, and besides the kind's
    # characters and commas, no other character is left
    if not ((codes[opens] == ord("[")).all() and (codes[closes] == ord("]")).all()
            and text.translate(None, CHARACTERS[kind] + b",") == b"[]" * len(raws)):
        raise _Unparsed(f"a value that is not a list of {'numbers' if kind != 'bool' else 'booleans'}")
    if kind == "bool":
        ends = np.flatnonzero(codes == ord("e"))  # `true` and `false` both end in it; `true` has `t` 3 before
        return np.searchsorted(ends, closes) - np.searchsorted(ends, opens), codes[ends - 3] == ord("t")
    commas = np.flatnonzero(codes == ord(","))
    counts = np.searchsorted(commas, closes) - np.searchsorted(commas, opens) + (closes - opens > 1)
    dtype = np.int64 if kind == "int" else np.float64
    if not values or not counts.sum():
        return counts, np.empty(0, dtype)
    # Arrow's CSV reader parses a number a line in C (faster here than its JSON reader on the lists), refusing
    # one beyond int64
    try:
        table = csv.read_csv(io.BytesIO(text.translate(ONE_A_LINE, b"[")),
                             read_options=csv.ReadOptions(column_names=["v"]),
                             convert_options=csv.ConvertOptions(column_types={"v": CSV_TYPES[kind]}, null_values=[]))
    except pa.ArrowInvalid as error:
        raise _Unparsed(f"a {'token id beyond int64' if kind == 'int' else 'number beyond float64'} ({error})") \
            from error
    parsed = table.column(0).to_numpy()
    if len(parsed) != counts.sum() or not np.isfinite(parsed).all():  # JSON has no infinity
        raise _Unparsed("a number beyond float64")
    return counts, parsed


def spread_nodes(mask: np.ndarray, mask_counts: np.ndarray, values: np.ndarray,
                 value_counts: np.ndarray) -> np.ndarray:
    """Each node's values over its sampled tokens (in order), placed on its mask's true positions, 0 elsewhere
    (and beyond the node's values): for nodes' masks and values one after another, `*_counts` a node."""
    sampled = np.cumsum(mask)
    before = np.concatenate([[0], sampled])[_starts(mask_counts)]      # true positions before each node
    rank = sampled - np.repeat(before + 1, mask_counts)                # a true position's rank in its node
    placed = mask & (rank < np.repeat(value_counts, mask_counts))
    out = np.zeros(len(mask))
    out[placed] = values[(np.repeat(_starts(value_counts), mask_counts) + rank)[placed]]
    return out


def spread(mask: list, values: list) -> list:
    """`spread_nodes` for one node."""
    return spread_nodes(np.array(mask, bool), np.array([len(mask)]), np.array(values, np.float64),
                        np.array([len(values)])).tolist()


class _NodeLists:
    """The lists of every node of a file (file-wide node numbers), parsed at once: each node's values one after
    another (the mask's and token ids' apart: they may differ in length in a bad line), and per node what the
    rows need in Python."""

    def __init__(self, nodes: list[Node], token_ids: bool) -> None:
        """`token_ids`: whether their values are wanted (else only counted: one beyond int64 is no error)."""
        tokens, self.token_ids = _lists([n.token_ids for n in nodes], "int", token_ids)
        masks, self.mask = _lists([n.mask for n in nodes], "bool")
        logprobs, logprob_values = _lists([n.logprobs for n in nodes], "float")
        scored, advantages = _lists([EMPTY if n.advantages == NULL else n.advantages for n in nodes], "float")
        self.token_starts, self.mask_starts = _starts(tokens), _starts(masks)
        self.tokens_per_node: np.ndarray = tokens
        self.logprobs = spread_nodes(self.mask, masks, logprob_values, logprobs)  # over the mask's positions
        sampled = np.concatenate([[0], np.cumsum(self.mask)])
        self.tokens: list[int] = tokens.tolist()
        self.masks: list[int] = masks.tolist()
        self.has_sampled: list[bool] = (sampled[self.mask_starts + masks] > sampled[self.mask_starts]).tolist()
        first, has = np.zeros(len(nodes)), scored > 0
        first[has] = advantages[_starts(scored)[has]]
        self.first_advantage: list[float | None] = [a if h else None for a, h in zip(first.tolist(), has.tolist())]

    def columns(self, nodes: np.ndarray, trains: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Rows' token columns, the rows' nodes one after another (`trains`: whether the row trains the node's
        sampled tokens): the values, and where each (row, node) ends in them."""
        lengths = self.tokens_per_node[nodes]
        ends = np.cumsum(lengths)
        within = np.arange(ends[-1] if len(ends) else 0) - np.repeat(ends - lengths, lengths)
        at_mask = np.repeat(self.mask_starts[nodes], lengths) + within
        return ends, {"token_ids": self.token_ids[np.repeat(self.token_starts[nodes], lengths) + within],
                      "loss_mask": (self.mask[at_mask] & np.repeat(trains, lengths)).astype(np.int8),
                      "logprobs": self.logprobs[at_mask].astype(np.float32)}


class _Rows:
    """The table's columns as lists, the heavy ones only when asked for: the token columns as each row's path of
    nodes (file-wide node numbers) and whether it trains each, gathered from the nodes' lists at the end."""

    def __init__(self, columns):
        wanted = set(SCHEMA.names) if columns is None else set(columns)
        self.tokens = any(c in wanted for c in (*TOKEN_COLUMNS, "prime_rl_advantage"))
        self.texts = {c for c in TEXT_COLUMNS if c in wanted}
        self.names = [n for n in SCHEMA.names if n in wanted]
        self.rows: list[dict] = []
        self.nodes: list[int] = []
        self.trains: list[bool] = []
        self.path_lengths: list[int] = []
        self.valid: list[bool] = []
        self.malformed: dict[str, str] = {}
        self.malformed_texts: dict[str, str] = {}
        self.count = 0

    def add(self, row: dict, valid: bool = True) -> None:
        self.rows.append(row)
        path = row.get("path", ())
        self.nodes.extend(path)
        self.trains.extend(row.get("trains", ()))
        self.path_lengths.append(len(path))
        self.valid.append(valid)
        self.count += 1

    def add_malformed(self, row: dict, why: str, text: str) -> None:
        self.malformed[str(self.count)] = why
        self.malformed_texts[str(self.count)] = text
        self.add(row, valid=False)

    def table(self, lists: _NodeLists) -> pa.Table:
        columns = {n: pa.array([row.get(n) for row in self.rows], SCHEMA.field(n).type) for n in self.names
                   if n not in TOKEN_COLUMNS}
        if self.tokens:
            ends, values = lists.columns(np.array(self.nodes, np.int64), np.array(self.trains, bool))
            row_ends = np.concatenate([[0], ends])[np.cumsum(self.path_lengths, dtype=np.int64)]
            offsets = pa.array(np.concatenate([[0], row_ends]), pa.int64())
            mask = pa.array([not v for v in self.valid], pa.bool_())
            columns.update((n, pa.LargeListArray.from_arrays(offsets, pa.array(v), mask=mask)
                            .cast(SCHEMA.field(n).type)) for n, v in values.items() if n in self.names)
        table = pa.table([columns[n] for n in self.names], schema=pa.schema([SCHEMA.field(n) for n in self.names]))
        if self.malformed:
            table = table.replace_schema_metadata({MALFORMED_LINES: json.dumps(self.malformed).encode(),
                                                   MALFORMED_TEXTS: json.dumps(self.malformed_texts).encode()})
        return table


def _check_group(episode: EpisodeRecord, where: str) -> None:
    if episode.group is None:
        raise Malformed(f"{where}: no `group.id` (prime-rl groups every training episode)")


def _check_nodes(parents: list[int | None], tokens: list[int], masks: list[int], where: str) -> None:
    """Each node's parent an earlier node, and as many mask values as token ids."""
    for j, (parent, n_tokens, n_mask) in enumerate(zip(parents, tokens, masks, strict=True)):
        if parent is not None and not 0 <= parent < j:
            raise Malformed(f"{where}, node {j}: `parent` {parent} is not an earlier node")
        if n_tokens != n_mask:
            raise Malformed(f"{where}, node {j}: {n_tokens} `token_ids` but {n_mask} `mask` values")


def _branches(parents: list[int | None]) -> list[list[int]]:
    """Each leaf's path from its root, leaves in node order (verifiers' Trace.branches)."""
    has_child = set(parents)
    paths: list[list[int]] = []
    for leaf in (i for i in range(len(parents)) if i not in has_child):
        path: list[int] = []
        at: int | None = leaf
        while at is not None:
            path.append(at)
            at = parents[at]
        paths.append(path[::-1])
    return paths


def _branch_columns(nodes: list[Node], first: int, path: list[int], trained: set[int], lists: _NodeLists,
                    texts: set[str]) -> dict:
    """A branch's columns besides the trace's (`first`: the file-wide number of the trace's node 0): whether it
    trains anything, its nodes and whether it trains each (a sampled node trained once, in the first branch
    holding it), and prime-rl's stored advantage at its first trained token."""
    trains_any = False
    advantage = None
    trains: list[bool] = []
    for j in path:
        has_sampled = lists.has_sampled[first + j]
        sampled = has_sampled and nodes[j].sampled
        trains.append(not (sampled and j in trained))
        if sampled:
            trained.add(j)
        trains_any = trains_any or (trains[-1] and has_sampled)
        if advantage is None and trains[-1] and has_sampled:
            advantage = lists.first_advantage[first + j]
    out: dict = {"trains_any": trains_any, "prime_rl_advantage": advantage, "path": [first + j for j in path],
                 "trains": trains}
    if "messages" in texts:
        out["messages"] = (b"[" + b",".join(bytes(nodes[j].message) for j in path) + b"]").decode()
    return out


def _episode_rows(episode: EpisodeRecord[Node], firsts: list[int | None], lists: _NodeLists, subset: str,
                  folder_step: int, trained_ids: frozenset[str] | None, texts: set[str], where: str) -> list[dict]:
    """The rows of one episode record (a line; `firsts`: each trace's first file-wide node number), or Malformed
    naming what is wrong."""
    _check_group(episode, where)
    assert episode.group is not None
    work = episode.run.work if episode.run is not None and episode.run.work is not None else Work()
    policy, env = work.policy or Policy(), episode.env or Env()
    base = {"step": folder_step if work.step is None else work.step, "rollouts_step": folder_step,
            "subset": subset, "episode_id": episode.id, "group_index": episode.group.id, "env_id": env.id,
            "env_name": env.name, "policy_start": policy.start, "policy_end": policy.end}
    out = []
    for t, (trace, first) in enumerate(zip(episode.traces, firsts, strict=True)):
        if trained_ids is not None and trace.id in trained_ids:
            continue  # trained: its rows come from the effective/ file that holds it
        assert first is not None  # every trace read is parsed
        at = f"{where}, trace {t}"
        parents = [node.parent for node in trace.nodes]
        last = first + len(parents)
        _check_nodes(parents, lists.tokens[first:last], lists.masks[first:last], at)
        errored = "trace errored" + (f": {trace.errors[-1].type}" if trace.errors and trace.errors[-1].type else "")
        reason = (None if subset == "effective" else errored if not trace.ok
                  else f"frozen agent {trace.agent.name!r}" if not trace.agent.trainable else NOT_IN_EFFECTIVE)
        shared = {**base, "trace_id": trace.id, "rollout_id": trace.id, "agent": trace.agent.name,
                  "trainable": trace.agent.trainable, "ok": trace.ok, "stop_condition": trace.stop_condition,
                  "reward": _reward(trace), "rewards": msgspec.json.encode(trace.rewards).decode(),
                  "metrics": _raw_text(trace.metrics)}
        if "task" in texts:
            shared["task"] = _raw_text(trace.task)
        trained: set[int] = set()
        for b, path in enumerate(_branches(parents)):
            columns = _branch_columns(trace.nodes, first, path, trained, lists, texts)
            not_trained = reason or (None if columns.pop("trains_any") else NO_TRAINABLE_TOKEN)
            out.append({**shared, **columns, "branch_index": b, "not_trained": not_trained})
    return out


def _typed_check(line: bytes | memoryview, trained_ids: frozenset[str] | None, where: str) -> str | None:
    """What is wrong in a line, with its lists typed (None: nothing): the message a line gets when the one-pass
    parse refused its file, each check in the order of the rows' own."""
    try:
        episode = TYPED.decode(line)
        _check_group(episode, where)
        for t, trace in enumerate(episode.traces):
            if trained_ids is None or trace.id not in trained_ids:
                _check_nodes([n.parent for n in trace.nodes], [len(n.token_ids) for n in trace.nodes],
                             [len(n.mask) for n in trace.nodes], f"{where}, trace {t}")
    except (msgspec.DecodeError, RecursionError) as error:  # not JSON, nested too deep, a field of another type
        return f"{where} is not a prime-rl episode record ({error})"
    except Malformed as error:
        return str(error)
    return None


def _read_lines(path: str, lines: list[tuple[int, bytes | memoryview]], subset: str, folder_step: int,
                trained_ids: frozenset[str] | None, columns, known: dict[int, str] | None) -> pa.Table:
    """The rows of a file's lines, the lists of all their nodes parsed at once; _Unparsed when one cannot be.
    `known`: the lines already found malformed (line number -> why), whose nodes are not parsed, nor those of
    traces an effective/ file holds; None: not looked for, and every node is parsed (the record types them all)."""
    rows = _Rows(columns)
    nodes: list[Node] = []
    episodes: list[tuple[EpisodeRecord[Node], list[int | None]] | str] = []
    for number, line in lines:
        if known is not None and number in known:
            episodes.append(known[number])
            continue
        try:
            episode = EPISODE.decode(line)
        except (msgspec.DecodeError, RecursionError):  # not JSON, nested too deep, a field of another type
            # the typed decoder names the first bad field, as in a line whose lists are of another type too
            episodes.append(_typed_check(line, trained_ids, f"{path}: line {number}") or "unreadable")
            continue
        firsts: list[int | None] = []
        for trace in episode.traces:
            skipped = known is not None and trained_ids is not None and trace.id in trained_ids
            firsts.append(None if skipped else len(nodes))
            if not skipped:
                nodes.extend(trace.nodes)
        episodes.append((episode, firsts))
    lists = _NodeLists(nodes, rows.tokens)
    for (number, line), parsed in zip(lines, episodes, strict=True):
        where = f"{path}: line {number}"
        try:
            if isinstance(parsed, str):
                raise Malformed(parsed)
            for row in _episode_rows(*parsed, lists, subset, folder_step, trained_ids, rows.texts, where):
                rows.add(row)
        except Malformed as error:
            text, why = bytes(line).decode("utf-8", "backslashreplace"), str(error)
            rows.add_malformed({"step": folder_step, "rollouts_step": folder_step, "subset": subset}, why, text)
    return rows.table(lists)


def _lines(data: bytes) -> list[tuple[int, bytes | memoryview]]:
    """The file's lines but blank ones, numbered as `bytes.splitlines` numbers them; views into `data`, not copies,
    where only newlines end them."""
    if b"\r" in data:
        return [(number, line) for number, line in enumerate(data.splitlines(), 1) if line.strip()]
    view, start, number = memoryview(data), 0, 0
    lines: list[tuple[int, bytes | memoryview]] = []
    while start < len(data):
        end = data.find(b"\n", start)
        end = len(data) if end < 0 else end
        number += 1
        if data[start] == ord("{") or data[start:end].strip():
            lines.append((number, view[start:end]))
        start = end + 1
    return lines


def read(path: str, columns, options: ReadOptions):
    data = read_bytes(path)
    if options.max_bytes is not None and len(data) > options.max_bytes:
        raise BadFile(Reason.FILE_TOO_LARGE, f"{path}: larger than --max-file-bytes")
    found = PATTERN.match(_posix(path))
    if found is None:
        raise BadFile(Reason.UNREADABLE_FILE, f"{path}: not a prime-rl step_N/train/{{all,effective}}/traces.jsonl")
    folder_step, subset = int(found.group(2)), found.group(3)
    trained_ids = _trained_ids(found.group(1)) if subset == "all" else None
    lines = _lines(data)
    try:
        table = _read_lines(path, lines, subset, folder_step, trained_ids, columns, None)
    except _Unparsed:  # a list of another type somewhere: the typed decoder names it, line by line
        known = {number: why for number, line in lines
                 if (why := _typed_check(line, trained_ids, f"{path}: line {number}")) is not None}
        try:
            table = _read_lines(path, lines, subset, folder_step, trained_ids, columns, known)
        except _Unparsed as error:  # the record's types admit it (a JSON integer is unbounded), Arrow's do not
            raise BadFile(Reason.VALUE_TOO_LARGE, f"{path}: {error}") from error
    return table, {"step": None, "prompt_group_sizes": None}


def plan(path: str, size: int, step: str, max_bytes: int) -> Footer:
    """The `step` values (the dispatch steps) of the file's rows: the file is parsed, as a JSONL file is."""
    try:
        table, _ = read(path, [step, step.split(".", 1)[0]], ReadOptions(max_bytes=max_bytes))
        return Footer(steps_in(table, step), size * 2)
    except BadFile:  # the one-pass path reports it
        return Footer(None, size * 2)


FORMAT = Format("prime-rl", matches=matches, read=read, plan=plan, companions=companions,
                preset=("--semantics=rollout-shared", "--estimator=dr_grpo", "--version-column=policy_start"),
                stored_advantage="prime_rl_advantage")
