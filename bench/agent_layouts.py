"""Reading the agent frameworks' layouts: each at ROWS training rows against the same rows as Parquet.

    python -m bench.agent_layouts [--rows 10000] [--rounds 3] [--layouts prime-rl roll]

For each layout (rLLM's episode JSON files, ROLL's step JSONL files, SkyRL's pickled training batches,
prime-rl's traces.jsonl) the bench writes ROWS rows in the framework's layout, reads them once through the
format registry to get the input table, and writes that table as Parquet split into the same files. It then
times reading every file of each, through `formats.read_table` (the path `relabel run` takes), alternating
the order each round, and reports the ratio of the medians (layout / Parquet). The JSON layouts' target
(issue 34) is at most TARGET; exit 1 above a layout's bound (BOUNDS) or when a read gives other than the rows
written (ROWS rounded down to whole files). SkyRL's batches are token tensors, not text: their ratio is
reported, and held to no target (the reader runs on a worker process, as every pickle's does). prime-rl's
traces carry every token id, mask bit and logprob as JSON numbers: parsing them alone takes several times a
Parquet read of the same rows, so its bound is a guard against regressions and the target is reported as
not met.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import statistics
import sys
import tempfile
import time
import types

import numpy as np
import pyarrow.parquet as pq

from bench.harness import RunFailed
from bench.paired import interleave
from rollout_relabel.transforms.lib.io import formats

TARGET = 3.0
STEPS_PER_TRAJECTORY = 5
TRAJECTORIES_PER_EPISODE = 2
ROWS_PER_ROLL_FILE = 2000
ROWS_PER_SKYRL_FILE = 1000  # one training batch a file (a step), 8 samples a prompt
SKYRL_PROMPT, SKYRL_RESPONSE = 64, 128  # tokens per row (left-padded prompt, right-aligned response)
SKYRL_MODULE = "skyrl.backends.skyrl_train.training_batch"
# prime-rl: per trace a prompt, two answers and a tool reply between them (PRIME_TOKENS tokens each, the
# answers' sampled with logprobs); every 4th trace forks into a second branch; PRIME_STEPS step folders
PRIME_TOKENS = (100, 200, 50, 150)
PRIME_STEPS = 5
TARGETS = {"rllm": TARGET, "roll": TARGET, "skyrl": None, "prime-rl": TARGET}
BOUNDS = {**TARGETS, "prime-rl": 15.0}  # above its bound a layout fails the run
ROWS_PER_FILE = {"roll": ROWS_PER_ROLL_FILE, "skyrl": ROWS_PER_SKYRL_FILE}


def write_rllm(root: str, rows: int) -> list[str]:
    """Episodes of TRAJECTORIES_PER_EPISODE trajectories of STEPS_PER_TRAJECTORY steps, 8 per task."""
    folder = os.path.join(root, "episodes", "train_step_1_epoch_0")
    os.makedirs(folder)
    paths = []
    for e in range(rows // (STEPS_PER_TRAJECTORY * TRAJECTORIES_PER_EPISODE)):
        episode_id = f"task{e // 8}:{e % 8}"
        episode = {"training_step": 1, "epoch": 0, "episode_id": episode_id, "session_id": None,
                   "task": {"question": f"q{e // 8}"}, "task_hash": f"{e // 8:08x}", "is_correct": e % 2 == 0,
                   "termination_reason": "ENV_DONE", "metrics": {}, "metadata": {}, "timing": {},
                   "trajectories": [{"name": f"agent{t}", "uid": f"{episode_id}-{t}", "reward": float(e % 3) / 2,
                                     "num_steps": STEPS_PER_TRAJECTORY, "timing": {},
                                     "steps": [{"observation": "x" * 200, "thought": "t" * 100, "action": "a" * 50,
                                                "reward": 0.0, "done": s == STEPS_PER_TRAJECTORY - 1,
                                                "model_response": "r" * 300,
                                                "chat_completions": [{"role": "user", "content": "c" * 200}],
                                                "timing": {}} for s in range(STEPS_PER_TRAJECTORY)]}
                                    for t in range(TRAJECTORIES_PER_EPISODE)]}
        path = os.path.join(folder, f"episode_hash{episode['task_hash']}_id{episode_id.replace(':', '_')}.json")
        with open(path, "w") as handle:
            handle.write(json.dumps(episode, indent=2) + "\n")
        paths.append(path)
    return paths


def write_roll(root: str, rows: int) -> list[str]:
    os.makedirs(root)
    paths = []
    meta = json.dumps({"generation_config": {"num_return_sequences": 8}})
    for step in range(rows // ROWS_PER_ROLL_FILE):
        n = ROWS_PER_ROLL_FILE
        columns = {"global_step": [step] * n, "id": [f"p{i // 8}" for i in range(n)], "source": ["math"] * n,
                   "prompt": ["q" * 300] * n, "messages": ["[]"] * n, "ground_truth": ["42"] * n,
                   "tag": ["math"] * n, "domain": ["math"] * n, "responses": ["r" * 600] * n,
                   "scores": [float(i % 2) for i in range(n)], "sampling_params": [meta] * n}
        path = os.path.join(root, f"rollout_dump_data.step_{step}.jsonl")
        with open(path, "w") as handle:
            handle.write(json.dumps(columns) + "\n")
        paths.append(path)
    return paths


def _rebuild_tensor_batch(cls, state):
    raise AssertionError("the bench only writes batches")


class TrainingInputBatch(dict):
    """Ours, under SkyRL's module and name: pickles as SkyRL's batch does (`_rebuild_tensor_batch(cls, state)`)."""

    def __init__(self, state):
        super().__init__()
        self.state = state

    def __reduce__(self):
        return (_rebuild_tensor_batch, (type(self), self.state))


_rebuild_tensor_batch.__module__ = TrainingInputBatch.__module__ = SKYRL_MODULE


@contextlib.contextmanager
def _skyrl_names():
    parts, added = SKYRL_MODULE.split("."), []
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        if name not in sys.modules:
            sys.modules[name] = types.ModuleType(name)
            added.append(name)
    vars(sys.modules[SKYRL_MODULE]).update(_rebuild_tensor_batch=_rebuild_tensor_batch,
                                           TrainingInputBatch=TrainingInputBatch)
    try:
        yield
    finally:
        for name in added:
            del sys.modules[name]


def write_skyrl(root: str, rows: int) -> list[str]:
    """`dumped_data/global_step_N_training_input.pkl`: SkyRL's state layout (numpy bytes per tensor)."""
    folder = os.path.join(root, "dumped_data")
    os.makedirs(folder)
    n, width, total = ROWS_PER_SKYRL_FILE, SKYRL_RESPONSE, SKYRL_PROMPT + SKYRL_RESPONSE
    rng = np.random.default_rng(0)
    response = np.ones((n, width), np.int64)
    advantages = np.repeat(rng.standard_normal((n, 1)).astype(np.float32), width, axis=1)
    logprobs = -rng.random((n, width), np.float32)
    tensors = {"sequences": rng.integers(0, 150_000, (n, total)), "attention_mask": np.ones((n, total), np.int64),
               "response_mask": response, "loss_mask": response.astype(np.float32), "advantages": advantages,
               "returns": advantages, "action_log_probs": logprobs, "base_action_log_probs": logprobs,
               "rollout_logprobs": logprobs}
    batch_dict = {key: {"format": "numpy", "data": value.tobytes(), "shape": value.shape, "dtype": str(value.dtype)}
                  for key, value in tensors.items()}
    metadata = {"policy_prompt_boundaries": [(i, i + 8) for i in range(0, n, 8)], "pad_size": 0,
                "response_length": width}
    paths = []
    for step in range(rows // n):
        path = os.path.join(folder, f"global_step_{step}_training_input.pkl")
        state = {"batch_dict": batch_dict, "batch_size": n, "device": None, "metadata": metadata}
        with _skyrl_names(), open(path, "wb") as handle:
            pickle.dump(TrainingInputBatch(state), handle)
        paths.append(path)
    return paths


def _prime_node(parent, role, n, first):
    sampled = role == "assistant"
    node = {"message": {"role": role, "content": role[0] * 4 * n}, "sampled": sampled, "timestamp": 1.0,
            "token_ids": list(range(first, first + n)), "mask": [sampled and k > 2 for k in range(n)],
            "is_content": [], "logprobs": [-0.25 - k / 1000 for k in range(n - 3)] if sampled else []}
    if parent is not None:
        node["parent"] = parent
    return node


def write_prime_rl(root: str, rows: int) -> list[str]:
    """prime-rl's effective/ files (FileMonitor, monitors/file.py): one episode a line, one trace each, groups of
    8; a forked trace is two rows."""
    paths, written, trace = [], 0, 0
    per_step = rows // PRIME_STEPS
    for step in range(PRIME_STEPS):
        folder = os.path.join(root, "rollouts", f"step_{step}", "train", "effective")
        os.makedirs(folder)
        lines = []
        while written < per_step * (step + 1):
            nodes = [_prime_node(None if i == 0 else i - 1, role, n, 1000 * i)
                     for i, (role, n) in enumerate(zip(("user", "assistant", "tool", "assistant"), PRIME_TOKENS))]
            if trace % 4 == 0 and written + 2 <= per_step * (step + 1):
                nodes += [_prime_node(1, "user", PRIME_TOKENS[2], 5000),
                          _prime_node(4, "assistant", PRIME_TOKENS[3], 6000)]
            written += 1 + (len(nodes) > 4)
            record = {"version": 1, "id": f"t{trace}", "task": {"type": "T", "data": {"idx": trace // 8}},
                      "agent": {"config": {}, "name": "agent", "trainable": True}, "tools": [], "nodes": nodes,
                      "calls": [], "rewards": {"acc": {"score": float(trace % 2), "weight": 1.0}}, "metrics": {},
                      "info": {}, "is_completed": True, "ok": True, "stop_condition": "done", "errors": []}
            lines.append(json.dumps({"id": f"e{trace}", "env": {"id": "env", "name": "env"},
                                     "task": {"type": "T", "data": {"idx": trace // 8}},
                                     "group": {"id": f"g{trace // 8}"},
                                     "run": {"type": "train", "id": "r", "work": {"type": "train", "step": step}},
                                     "ok": True, "errors": [], "traces": [record]}, separators=(",", ":")))
            trace += 1
        path = os.path.join(folder, "traces.jsonl")
        with open(path, "w") as handle:
            handle.write("\n".join(lines) + "\n")
        paths.append(path)
    return paths


def as_parquet(paths: list[str], root: str) -> list[str]:
    os.makedirs(root)
    out = []
    for i, path in enumerate(paths):
        table, _ = formats.read_table(path)
        target = os.path.join(root, f"part{i:05d}.parquet")
        pq.write_table(table, target)
        out.append(target)
    return out


def read_all(paths: list[str]) -> tuple[float, int]:
    start = time.perf_counter()
    rows = sum(formats.read_table(p)[0].num_rows for p in paths)
    return time.perf_counter() - start, rows


def reader(name: str, files: dict[str, list[str]], expected: int):
    """(kind, round) -> seconds to read files[kind]; RunFailed unless it gives the expected rows."""
    def timed(kind: str, round_: int) -> float:
        seconds, rows = read_all(files[kind])
        if rows != expected:
            raise RunFailed(f"{name} {kind}: {rows} rows read")
        return seconds
    return timed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layouts", nargs="+", choices=list(TARGETS), default=list(TARGETS),
                        help="the layouts to read (default: all)")
    args = parser.parse_args(argv)
    failed = False
    with tempfile.TemporaryDirectory(prefix="bench-agent-layouts-") as root:
        for name, write in (("rllm", write_rllm), ("roll", write_roll), ("skyrl", write_skyrl),
                            ("prime-rl", write_prime_rl)):
            if name not in args.layouts:
                continue
            layout = write(os.path.join(root, name), args.rows)
            parquet = as_parquet(layout, os.path.join(root, f"{name}-parquet"))
            rows = (len(layout) * ROWS_PER_FILE[name] if name in ROWS_PER_FILE
                    else args.rows // PRIME_STEPS * PRIME_STEPS if name == "prime-rl" else args.rows)
            try:
                times = interleave(["layout", "parquet"], args.rounds,
                                   reader(name, {"layout": layout, "parquet": parquet}, rows))
            except RunFailed as short:
                print(short, file=sys.stderr)
                return 1
            lay, par = statistics.median(times["layout"]), statistics.median(times["parquet"])
            ratio, target, bound = lay / par, TARGETS[name], BOUNDS[name]
            failed |= bound is not None and ratio > bound
            missed = f", not met; regression bound {bound}x" if target and bound != target and ratio > target else ""
            print(f"{name}: {rows} rows in {len(layout)} files: layout {lay * 1000:.0f} ms, parquet "
                  f"{par * 1000:.0f} ms, ratio {ratio:.2f}x" + (f" (target <= {target}x{missed})" if target else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
