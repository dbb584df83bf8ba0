"""prime-rl runs in its on-disk layout, built here from the documented record fields (never its code).

`FileMonitor.log_episodes` (PrimeIntellect-ai/prime-rl, src/prime_rl/monitors/file.py at 559b44772e47) appends
each episode's `Episode.to_record()` (PrimeIntellect-ai/verifiers, verifiers/v1/episode.py and trace.py at
a60a606ecc4d) as one compact JSON line to `{out}/rollouts/step_{N}/{train,eval}/{all,effective}/traces.jsonl`;
None fields are left out (exclude_none), so a root node has no `parent` and an unscored node no `advantages`.

A run is described by RUN below; `write_run` writes it (all/ at each episode's arrival step, effective/ at the
step that trained each trace, with prime-rl's GRPO advantages stamped on its nodes) and `grpo` restates the
advantage prime-rl computes (prime_rl/orchestrator/algo/grpo.py), independently of the tool.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import numpy as np

# (nodes' parents, token ids, masks) of the two graph shapes. linear: prompt, answer, tool, answer (one
# branch). fork: two branches sharing the first answer (trained in branch 0 only) and a prompt-only leaf.
SHAPES = {
    "linear": [(None, "user", [1, 2, 3], [0, 0, 0]), (0, "assistant", [4, 5, 6], [0, 1, 1]),
               (1, "tool", [7], [0]), (2, "assistant", [8, 9], [0, 1])],
    "fork": [(None, "user", [1, 2, 3], [0, 0, 0]), (0, "assistant", [4, 5, 6], [0, 1, 1]),
             (1, "user", [7, 8], [0, 0]), (2, "assistant", [9, 10, 11], [0, 1, 1]),
             (1, "user", [12], [0]), (4, "assistant", [13, 14], [0, 1]), (0, "user", [15, 16], [0, 0])],
}


@dataclass
class Trace:
    rewards: dict            # name -> score, (score, weight) or None
    shape: str = "linear"
    agent: str = "solver"
    trainable: bool = True
    ok: bool = True
    trained_at: int | None = None  # the effective/ step holding it; None: never trained
    id: str = ""

    @property
    def reward(self) -> float:
        return sum(v if not isinstance(v, tuple) else v[0] * v[1] for v in self.rewards.values() if v is not None)

    @property
    def survives(self) -> bool:  # base.py iter_trainable_traces
        return self.ok and self.trainable


@dataclass
class Episode:
    group: str
    dispatched: int
    arrived: int
    traces: list[Trace] = field(default_factory=list)
    id: str = ""


# group g-1: split over two trained steps, one errored trace; g-2: solvers with frozen judges; g-3: uniform
# (every advantage 0: prime-rl's filter_zero_advantages ships none); g-4: dispatched and trained at step 1
RUN = [
    Episode("g-1", 0, 0, [Trace({"acc": 1.0}, trained_at=0)]),
    Episode("g-1", 0, 0, [Trace({"acc": 0.0}, trained_at=0)]),
    Episode("g-1", 0, 0, [Trace({"acc": (0.5, 0.5)}, shape="fork", trained_at=1)]),
    Episode("g-1", 0, 0, [Trace({"acc": None}, ok=False)]),
    Episode("g-2", 0, 0, [Trace({"acc": 1.0}, trained_at=0), Trace({"verdict": 0.0}, agent="judge", trainable=False)]),
    Episode("g-2", 0, 0, [Trace({"acc": 0.5, "fmt": (1.0, 0.2)}, trained_at=0),
                          Trace({"verdict": 1.0}, agent="judge", trainable=False)]),
    Episode("g-3", 1, 1, [Trace({"acc": 1.0})]),
    Episode("g-3", 1, 1, [Trace({"acc": 1.0})]),
    Episode("g-4", 1, 1, [Trace({"acc": 0.2}, trained_at=1)]),
    Episode("g-4", 1, 1, [Trace({"acc": 0.9}, trained_at=1)]),
    Episode("g-4", 1, 1, [Trace({"acc": 0.4}, trained_at=1)]),
    Episode("g-5", 1, 1, []),  # an episode that failed before any trace: no branch, no row
]
for e, episode in enumerate(RUN):
    episode.id = f"ep{e}"
    for t, trace in enumerate(episode.traces):
        trace.id = f"tr{e}-{t}"


def grpo(run=RUN) -> dict[str, float]:
    """prime-rl's GRPO restated: per rollout group, over its clean trainable traces, reward minus the group
    mean, in float32 (no std, no epsilon; one trace: 0). {trace id: advantage}."""
    groups: dict[str, list[Trace]] = {}
    for episode in run:
        groups.setdefault(episode.group, []).extend(t for t in episode.traces if t.survives)
    out = {}
    for traces in filter(None, groups.values()):
        rewards = np.array([t.reward for t in traces], dtype=np.float32)
        for trace, advantage in zip(traces, rewards - rewards.mean(), strict=True):
            out[trace.id] = float(advantage)
    return out


def node_record(parent, role, tokens, mask, index, advantage=None):
    sampled = role == "assistant"
    record = {"message": {"role": role, "content": f"{role} message {index}"}, "sampled": sampled,
              "timestamp": 1.0 + index, "token_ids": tokens, "mask": [bool(m) for m in mask], "is_content": [],
              "logprobs": [-0.5 - index / 10 - k / 100 for k in range(sum(mask))]}
    if parent is not None:
        record["parent"] = parent
    if advantage is not None and any(mask):
        record["advantages"] = [advantage] * sum(mask)
    return record


def trace_record(trace: Trace, advantage=None) -> dict:
    rewards = {k: None if v is None else {"score": v[0], "weight": v[1]} if isinstance(v, tuple)
               else {"score": v, "weight": 1.0} for k, v in trace.rewards.items()}
    record = {
        "version": 1, "id": trace.id, "verifiers": {"version": "0.3.1"},
        "task": {"type": "MathTask", "data": {"idx": 3, "question": "2+2?", "answer": "4"}, "key": "k3"},
        "agent": {"config": {"id": "default"}, "name": trace.agent, "trainable": trace.trainable}, "tools": [],
        "nodes": [node_record(p, role, tokens, mask, i, advantage) for i, (p, role, tokens, mask)
                  in enumerate(SHAPES[trace.shape])],
        "calls": [], "request_rewrites": [], "response_rewrites": [], "rewards": rewards, "metrics": {"turns": 2.0},
        "info": {} if advantage is None else {"advantage": advantage}, "extra_usage": [],
        "is_completed": True, "ok": trace.ok, "stop_condition": "done" if trace.ok else "error",
        "errors": [] if trace.ok else [{"type": "SandboxError", "message": "sandbox died"}],
        "timing": {"start": 0.0},
    }
    return record


def episode_record(episode: Episode, traces: list[dict], kind="train") -> dict:
    return {"id": episode.id, "env": {"id": "math-env", "name": "math"},
            "task": {"type": "MathTask", "data": {"idx": 3}}, "group": {"id": episode.group},
            "run": {"type": "train", "id": "run-1", "work": {"type": kind, "step": episode.dispatched,
                                                              "policy": {"start": episode.dispatched,
                                                                         "end": episode.arrived}}},
            "ok": bool(traces) and all(t["ok"] for t in traces),
            "errors": [] if traces else [{"type": "EmptyEpisode", "message": "Episode returned with no traces"}],
            "traces": traces}


def append(root, step, kind, subset, record) -> str:
    path = os.path.join(root, "rollouts", f"step_{step}", kind, subset, "traces.jsonl")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as handle:
        handle.write(json.dumps(record, separators=(",", ":")) + "\n")
    return path


def write_run(root, run=RUN) -> None:
    """all/ as episodes arrive (before scoring: no advantages), then effective/ per trained step: each episode
    with only its traces trained at that step, advantages stamped."""
    advantages = grpo(run)
    for episode in run:
        traces = [trace_record(t) for t in episode.traces]
        append(root, episode.arrived, "train", "all", episode_record(episode, traces))
    for step in sorted({t.trained_at for e in run for t in e.traces if t.trained_at is not None}):
        for episode in run:
            shipped = [trace_record(t, advantages[t.id]) for t in episode.traces if t.trained_at == step]
            if shipped:
                append(root, step, "train", "effective", episode_record(episode, shipped))
    evaluation = Episode("g-eval", 0, 0, [Trace({"acc": 1.0}, agent="solver")], id="ep-eval")
    evaluation.traces[0].id = "tr-eval"
    for subset in ("all", "effective"):
        append(root, 0, "eval", subset, episode_record(evaluation, [trace_record(evaluation.traces[0])], "eval"))
