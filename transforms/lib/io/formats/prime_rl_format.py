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

import json
import re
import threading
from collections.abc import Sequence

import msgspec
import pyarrow as pa

from rollout_relabel.transforms.core.reasons import Reason
from rollout_relabel.transforms.lib.errors import BadFile
from rollout_relabel.transforms.lib.io import filesystem
from rollout_relabel.transforms.lib.io.formats.format import Format, ReadOptions, planned_by_reading, read_bytes
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


# The record's fields the rows need, typed: msgspec reads a line straight into them (the per-token lists in C)
# and skips every other field unread; a field of another type names its path ($.traces[0].nodes[3].mask[0]).
# Defaults are the record's (verifiers' models), whose null fields the writer leaves out.
def _null() -> msgspec.Raw:
    return msgspec.Raw(b"null")


class Node(msgspec.Struct, gc=False):
    parent: int | None = None
    message: msgspec.Raw = msgspec.field(default_factory=_null)  # kept as its JSON text
    sampled: bool = False
    token_ids: list[int] = []
    mask: list[bool] = []
    logprobs: list[float] = []       # over the sampled tokens
    advantages: list[float] | None = None  # over the sampled tokens, once scored


class RewardValue(msgspec.Struct, gc=False):
    score: float
    weight: float = 1.0


class Agent(msgspec.Struct, gc=False):
    name: str = "agent"
    trainable: bool = True


class TraceError(msgspec.Struct, gc=False):
    type: str | None = None


class TraceRecord(msgspec.Struct, gc=False):
    id: str
    task: msgspec.Raw = msgspec.field(default_factory=_null)
    agent: Agent = msgspec.field(default_factory=Agent)
    nodes: list[Node] = []
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


class EpisodeRecord(msgspec.Struct, gc=False):
    id: str | None = None
    env: Env | None = None
    group: Group | None = None
    run: Run | None = None
    traces: list[TraceRecord] = []


class TraceId(msgspec.Struct, gc=False):
    id: str


class EpisodeIds(msgspec.Struct, gc=False):
    traces: list[TraceId] = []


EPISODE = msgspec.json.Decoder(EpisodeRecord)
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


def spread(mask: list, values: list) -> list:
    """A node's values over its sampled tokens (in order), placed on the mask's true positions, 0 elsewhere."""
    sampled = mask.count(True)
    if not sampled:
        return [0.0] * len(mask)
    first = mask.index(True)
    if first + sampled == len(mask) and len(values) >= sampled:  # the usual node: scaffold, then its completion
        return [0.0] * first + values[:sampled]
    out, k = [], 0
    for is_sampled in mask:
        if is_sampled:
            out.append(values[k] if k < len(values) else 0.0)
            k += 1
        else:
            out.append(0.0)
    return out


def _check_nodes(nodes: list[Node], where: str) -> None:
    for j, node in enumerate(nodes):
        if node.parent is not None and not 0 <= node.parent < j:
            raise Malformed(f"{where}, node {j}: `parent` {node.parent} is not an earlier node")
        if len(node.token_ids) != len(node.mask):
            raise Malformed(f"{where}, node {j}: {len(node.token_ids)} `token_ids` but {len(node.mask)} `mask` values")


def _branches(nodes: list[Node]) -> list[list[int]]:
    """Each leaf's path from its root, leaves in node order (verifiers' Trace.branches)."""
    has_child = {node.parent for node in nodes}
    paths: list[list[int]] = []
    for leaf in (i for i in range(len(nodes)) if i not in has_child):
        path: list[int] = []
        at: int | None = leaf
        while at is not None:
            path.append(at)
            at = nodes[at].parent
        paths.append(path[::-1])
    return paths


class _Rows:
    """The table's columns as lists, the heavy ones only when asked for: the token columns as one flat list
    each (a branch's values one after another) and the offsets where each row's begin."""

    def __init__(self, columns):
        wanted = set(SCHEMA.names) if columns is None else set(columns)
        self.tokens = any(c in wanted for c in (*TOKEN_COLUMNS, "prime_rl_advantage"))
        self.texts = {c for c in TEXT_COLUMNS if c in wanted}
        self.names = [n for n in SCHEMA.names if n in wanted]
        self.data: dict[str, list] = {n: [] for n in self.names if n not in TOKEN_COLUMNS}
        self.token_ids: list = []
        self.mask: list = []
        self.logprobs: list = []
        self.offsets: list[int] = [0]
        self.valid: list[bool] = []
        self.malformed: dict[str, str] = {}
        self.malformed_texts: dict[str, str] = {}
        self.count = 0

    def mark(self) -> int:
        return len(self.token_ids)

    def rollback(self, mark: int) -> None:
        """Drop what a line that turned out malformed appended to the flat lists."""
        del self.token_ids[mark:], self.mask[mark:], self.logprobs[mark:]

    def add(self, row: dict, valid: bool = True) -> None:
        for name, values in self.data.items():
            values.append(row.get(name))
        self.offsets.append(row.get("end", len(self.token_ids)))
        self.valid.append(valid)
        self.count += 1

    def add_malformed(self, row: dict, why: str, text: str) -> None:
        self.malformed[str(self.count)] = why
        self.malformed_texts[str(self.count)] = text
        self.add(row, valid=False)

    def table(self, path: str) -> pa.Table:
        columns = {n: pa.array(values, SCHEMA.field(n).type) for n, values in self.data.items()}
        if self.tokens:
            offsets, mask = pa.array(self.offsets, pa.int64()), pa.array([not v for v in self.valid], pa.bool_())
            try:
                values = {"token_ids": pa.array(self.token_ids, pa.int64()),
                          "loss_mask": pa.array(self.mask, pa.bool_()).cast(pa.int8()),
                          "logprobs": pa.array(self.logprobs, pa.float32())}
            except (pa.ArrowException, OverflowError) as error:
                raise BadFile(Reason.VALUE_TOO_LARGE, f"{path}: a token id beyond int64 ({error})") from error
            columns.update((n, pa.LargeListArray.from_arrays(offsets, v, mask=mask).cast(SCHEMA.field(n).type))
                           for n, v in values.items() if n in self.names)
        table = pa.table([columns[n] for n in self.names], schema=pa.schema([SCHEMA.field(n) for n in self.names]))
        if self.malformed:
            table = table.replace_schema_metadata({MALFORMED_LINES: json.dumps(self.malformed).encode(),
                                                   MALFORMED_TEXTS: json.dumps(self.malformed_texts).encode()})
        return table


def _branch_columns(nodes: list[Node], path: list[int], trained: set[int], rows: _Rows) -> dict:
    """A branch's columns besides the trace's: whether it trains anything; with the token columns asked for,
    its tokens, its training mask (a sampled node trained once, in the first branch holding it) and sampling
    logprobs appended to the flat lists, and prime-rl's stored advantage at its first trained token."""
    trains_any = False
    advantage = None
    for j in path:
        node = nodes[j]
        has_sampled = True in node.mask
        sampled = has_sampled and node.sampled
        trains = not (sampled and j in trained)
        if sampled:
            trained.add(j)
        trains_any = trains_any or (trains and has_sampled)
        if not rows.tokens:
            continue
        rows.token_ids.extend(node.token_ids)
        rows.mask.extend(node.mask if trains else [False] * len(node.mask))
        rows.logprobs.extend(spread(node.mask, node.logprobs))
        if advantage is None and trains and has_sampled and node.advantages:
            advantage = node.advantages[0]
    out: dict = {"trains": trains_any, "prime_rl_advantage": advantage, "end": len(rows.token_ids)}
    if "messages" in rows.texts:
        out["messages"] = b"[" + b",".join(bytes(nodes[j].message) for j in path) + b"]"
    return out


def _episode_rows(line: bytes, subset: str, folder_step: int, trained_ids: frozenset[str] | None, rows: _Rows,
                  where: str) -> list[dict]:
    """The rows of one episode record (a line), or Malformed naming what is wrong."""
    try:
        episode = EPISODE.decode(line)
    except (msgspec.DecodeError, RecursionError) as error:  # not JSON, nested too deep, a field of another type
        raise Malformed(f"{where} is not a prime-rl episode record ({error})") from error
    if episode.group is None:
        raise Malformed(f"{where}: no `group.id` (prime-rl groups every training episode)")
    work = episode.run.work if episode.run is not None and episode.run.work is not None else Work()
    policy, env = work.policy or Policy(), episode.env or Env()
    base = {"step": folder_step if work.step is None else work.step, "rollouts_step": folder_step,
            "subset": subset, "episode_id": episode.id, "group_index": episode.group.id, "env_id": env.id,
            "env_name": env.name, "policy_start": policy.start, "policy_end": policy.end}
    out = []
    for t, trace in enumerate(episode.traces):
        if trained_ids is not None and trace.id in trained_ids:
            continue  # trained: its rows come from the effective/ file that holds it
        at = f"{where}, trace {t}"
        _check_nodes(trace.nodes, at)
        errored = "trace errored" + (f": {trace.errors[-1].type}" if trace.errors and trace.errors[-1].type else "")
        reason = (None if subset == "effective" else errored if not trace.ok
                  else f"frozen agent {trace.agent.name!r}" if not trace.agent.trainable else NOT_IN_EFFECTIVE)
        shared = {**base, "trace_id": trace.id, "rollout_id": trace.id, "agent": trace.agent.name,
                  "trainable": trace.agent.trainable, "ok": trace.ok, "stop_condition": trace.stop_condition,
                  "reward": _reward(trace), "rewards": msgspec.json.encode(trace.rewards).decode(),
                  "metrics": _raw_text(trace.metrics)}
        if "task" in rows.texts:
            shared["task"] = _raw_text(trace.task)
        trained: set[int] = set()
        for b, path in enumerate(_branches(trace.nodes)):
            columns = _branch_columns(trace.nodes, path, trained, rows)
            not_trained = reason or (None if columns.pop("trains") else NO_TRAINABLE_TOKEN)
            if "messages" in columns:
                columns["messages"] = columns["messages"].decode()
            out.append({**shared, **columns, "branch_index": b, "not_trained": not_trained})
    return out


def read(path: str, columns, options: ReadOptions):
    data = read_bytes(path)
    if options.max_bytes is not None and len(data) > options.max_bytes:
        raise BadFile(Reason.FILE_TOO_LARGE, f"{path}: larger than --max-file-bytes")
    found = PATTERN.match(_posix(path))
    if found is None:
        raise BadFile(Reason.UNREADABLE_FILE, f"{path}: not a prime-rl step_N/train/{{all,effective}}/traces.jsonl")
    folder_step, subset = int(found.group(2)), found.group(3)
    trained_ids = _trained_ids(found.group(1)) if subset == "all" else None
    rows = _Rows(columns)
    for number, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}: line {number}"
        mark = rows.mark()
        try:
            for row in _episode_rows(line, subset, folder_step, trained_ids, rows, where):
                rows.add(row)
        except Malformed as error:
            rows.rollback(mark)
            text, why = line.decode("utf-8", "backslashreplace"), str(error)
            rows.add_malformed({"step": folder_step, "rollouts_step": folder_step, "subset": subset}, why, text)
    return rows.table(path), {"step": None, "prompt_group_sizes": None}


FORMAT = Format("prime-rl", matches=matches, read=read, plan=planned_by_reading(read), companions=companions,
                preset=("--semantics=rollout-shared", "--estimator=dr_grpo", "--version-column=policy_start"),
                stored_advantage="prime_rl_advantage")
