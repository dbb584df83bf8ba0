"""SkyRL's training batches: `RayPPOTrainer.dump_data` (NovaSky-AI/SkyRL, skyrl/train/trainer.py at
a9564572eb8e91076be43c1bd5e4615e3de17265; the fully async trainer calls it alike) pickles the batch it is about to
train on to `{trainer.export_path}/dumped_data/global_step_{N}_training_input.pkl` when `trainer.dump_data_batch`
is set, after the advantages are computed and the rewards, `uids` and `is_last_step` removed.

The batch (`TrainingInputBatch`, skyrl/backends/skyrl_train/training_batch.py) pickles through its `__reduce__`
as `_rebuild_tensor_batch(TrainingInputBatch, state)`, state = {batch_dict, batch_size, device, metadata}: each
tensor as {"format": "numpy", data, shape, dtype}, a dtype numpy lacks (bfloat16) as {"format": "torch", data: a
torch.save zip}, a list of tensors as {"format": "tensor_list", items}, an absent one as None. The
`device` is a `torch.device`. Rows are left-padded: `sequences` / `attention_mask` span prompt and response,
the response-wide tensors (`response_mask`, `loss_mask`, `advantages`, ...) are right-aligned. The last
`metadata["pad_size"]` rows are padding (copies of row 0, loss mask 0), added to fill the data-parallel
ranks; `metadata["policy_prompt_boundaries"]` gives each prompt's (start, end) rows, padding excluded.

The pickle is read by a restricted unpickler: the only globals it resolves are SkyRL's two batch names and
`torch.device`, each mapped to a function of ours (`_ADMITTED`); SkyRL and torch are never imported for them,
and any other global refuses the file (unsafe-pickle). A nested torch.save blob is loaded by safe_pickle,
as a `.pt` dump is. Like a `.pt` dump, the file is read on a worker process bounded in time and memory.

SkyRL keeps no rewards in the batch, so its own advantages are what the rows carry: `skyrl_advantage`
is each row's stored advantage at its first trainable token (SkyRL's estimators give a row one value,
broadcast over its response), and the preset passes it through (`--estimator none`).
"""
from __future__ import annotations

import io
import multiprocessing
import os
import pickle
import re

import numpy as np
import pyarrow as pa

from rollout_relabel.transforms.core.reasons import Reason
from rollout_relabel.transforms.lib.errors import BadFile
from rollout_relabel.transforms.lib.io import pt_dumps, safe_pickle
from rollout_relabel.transforms.lib.io.formats.format import Format, ReadOptions, planned_by_name, read_bytes, tail
from rollout_relabel.transforms.lib.worker import processes as processes_pool

PATTERN = re.compile(r"(?:^|/)global_step_(-?\d+)_training_input\.pkl$")
_MODULE = "skyrl.backends.skyrl_train.training_batch"
# the numeric dtypes a numpy-format tensor may name (numpy's `str(arr.dtype)`)
_DTYPES = frozenset(("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                     "float16", "float32", "float64"))
# the tensors kept besides tokens and masks, each a list over the row's response tokens (SkyRL's names;
# `rollout_logprobs` under slime's `rollout_log_probs`, the name the tool reads for the engine's logprobs)
_RESPONSE_LISTS = {"advantages": "advantages", "returns": "returns", "action_log_probs": "action_log_probs",
                   "base_action_log_probs": "base_action_log_probs", "values": "values", "kl": "kl",
                   "rollout_logprobs": "rollout_log_probs"}
_REQUIRED = ("sequences", "attention_mask", "response_mask", "loss_mask", "advantages")
# routing replay and image inputs: kept by no row (their shapes are per token of the model, per image)
_NOT_KEPT = frozenset(("rollout_expert_indices", "router_padding_mask", "pixel_values", "image_grid_thw"))


def matches(path: str) -> bool:
    return PATTERN.search(path.replace("\\", "/")) is not None


def step_from_name(path: str) -> int | None:
    found = PATTERN.search(path.replace("\\", "/"))
    return int(found.group(1)) if found else None


# --------------------------------------------------------------------------- the restricted unpickler


class _Refused(pickle.UnpicklingError):
    """The pickle names a global (or a persistent id) that is not admitted."""


class _BatchClass:
    """What SkyRL's `TrainingInputBatch` stands for here: only `_rebuild_tensor_batch` takes it, it is never made.
    SkyRL before its #1379 pickled a batch as a dict subclass (NEWOBJ of the class, then every tensor again
    through torch's storage functions): such a file is refused here, at the class."""
    __slots__ = ()

    def __new__(cls, *args, **kwargs):
        raise _Refused("TrainingInputBatch is made without _rebuild_tensor_batch (a batch pickled before SkyRL's "
                       "#1379, its tensors through torch's storage functions)")

    @staticmethod
    def __setstate__(state):
        raise _Refused("BUILD on the batch class")


class _Batch:
    """`_rebuild_tensor_batch(TrainingInputBatch, state)`: SkyRL's state, as it was pickled."""
    __slots__ = ("state",)

    def __init__(self, state):
        self.state = state

    def __setstate__(self, state):
        raise _Refused("BUILD on the batch")


_TRAINING_INPUT_BATCH = _BatchClass


def _rebuild(cls, state):
    if cls is not _TRAINING_INPUT_BATCH:
        raise _Refused("_rebuild_tensor_batch of another class than TrainingInputBatch")
    return _Batch(state)


def _device(kind, index=None):
    """`torch.device(...)` as its text: the batch only records where its tensors were (SkyRL asserts the CPU)."""
    if type(kind) is not str or (index is not None and type(index) is not int):
        raise _Refused("torch.device with arguments other than a name and an index")
    return kind if index is None else f"{kind}:{index}"


# the only globals a batch's pickle may name, each our own function (or the batch class's stand-in)
_ADMITTED = {
    (_MODULE, "_rebuild_tensor_batch"): _rebuild,
    (_MODULE, "TrainingInputBatch"): _TRAINING_INPUT_BATCH,
    ("torch", "device"): _device,
}


class _Unpickler(pickle.Unpickler):
    """The C unpickler, its globals restricted to _ADMITTED (exact names: no import, no attribute chain); a
    function is handed out wrapped, one wrapper per load, so that no load can write into it."""

    def find_class(self, module, name):
        admitted = _ADMITTED.get((module, name))
        if admitted is None:
            raise _Refused(f"global {module}.{name} is not one of SkyRL's batch names")
        return admitted if admitted is _TRAINING_INPUT_BATCH else safe_pickle.Admitted(admitted, _Refused)

    def persistent_load(self, pid):
        raise _Refused("a persistent id (pickle.dump of a batch writes none)")


def load_batch(source) -> dict:
    """The batch's state from the pickle's bytes or a binary file, or _Refused / another unpickling error."""
    batch = _Unpickler(io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source).load()
    if not isinstance(batch, _Batch):
        raise ValueError(f"the pickle holds a {type(batch).__name__}, not a SkyRL TrainingInputBatch")
    return batch.state


# --------------------------------------------------------------------------- the batch into rows


def _tensor(path: str, key: str, value) -> np.ndarray:
    """One serialised tensor as a numpy array (bfloat16 as float32)."""
    if not isinstance(value, dict):
        raise BadFile(Reason.UNREADABLE_FILE, f"{path}: batch_dict[{key!r}] is a {type(value).__name__}, not a "
                                              "serialised tensor")
    if value.get("format") == "torch":
        data = value.get("data")
        if not isinstance(data, bytes):
            raise BadFile(Reason.UNREADABLE_FILE, f"{path}: batch_dict[{key!r}]: torch data is not bytes")
        try:
            tensor = safe_pickle.load(data=data)
        except safe_pickle.UnsafePickle as error:
            raise BadFile(Reason.UNSAFE_PICKLE, f"{path}: batch_dict[{key!r}]: refused: its torch.save blob "
                                                f"needs arbitrary unpickling ({error})") from error
        except safe_pickle.UnreadableDump as error:
            raise BadFile(Reason.UNREADABLE_FILE, f"{path}: batch_dict[{key!r}]: {error}") from error
        import torch  # the blob held a tensor (safe_pickle imported torch to load it)

        if not isinstance(tensor, torch.Tensor):
            raise BadFile(Reason.UNREADABLE_FILE, f"{path}: batch_dict[{key!r}]: the torch blob holds a "
                                                  f"{type(tensor).__name__}, not a tensor")
        return (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).numpy()
    if value.get("format", "numpy") != "numpy":  # SkyRL reads a dict without "format" as numpy's
        raise BadFile(Reason.UNREADABLE_FILE, f"{path}: batch_dict[{key!r}] has format {value.get('format')!r}")
    data, shape, dtype = value.get("data"), value.get("shape"), value.get("dtype")
    if dtype not in _DTYPES:
        raise BadFile(Reason.ILL_TYPED_COLUMN, f"{path}: batch_dict[{key!r}] has dtype {dtype!r}; expected one of "
                                               f"{', '.join(sorted(_DTYPES))}")
    if not isinstance(shape, (tuple, list)) or any(type(n) is not int or n < 0 for n in shape):
        raise BadFile(Reason.UNREADABLE_FILE, f"{path}: batch_dict[{key!r}] has shape {shape!r}")
    if not isinstance(data, (bytes, bytearray)):
        raise BadFile(Reason.UNREADABLE_FILE, f"{path}: batch_dict[{key!r}]: data is not bytes")
    itemsize = np.dtype(dtype).itemsize
    if len(data) != int(np.prod(shape, dtype=object)) * itemsize:
        raise BadFile(Reason.UNREADABLE_FILE, f"{path}: batch_dict[{key!r}]: {len(data)} bytes for shape "
                                              f"{tuple(shape)} of {dtype} (truncated or inconsistent)")
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def _rows_of(path: str, state, step: int | None) -> pa.Table:
    if not isinstance(state, dict) or not isinstance(state.get("batch_dict"), dict):
        raise BadFile(Reason.UNREADABLE_FILE, f"{path}: not a SkyRL TrainingInputBatch state (no batch_dict)")
    batch, metadata = state["batch_dict"], state.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise BadFile(Reason.UNREADABLE_FILE, f"{path}: metadata is a {type(metadata).__name__}, not a dict")
    missing = [key for key in _REQUIRED if batch.get(key) is None]
    if missing:
        raise BadFile(Reason.MISSING_COLUMN, f"{path}: the batch has no {', '.join(missing)}")
    tensors = {key: _tensor(path, key, value) for key, value in batch.items()
               if value is not None and key not in _NOT_KEPT and (key in _REQUIRED or key in _RESPONSE_LISTS)}
    n = state.get("batch_size")
    if n is None:
        n = len(tensors["sequences"])
    if type(n) is not int:
        raise BadFile(Reason.UNREADABLE_FILE, f"{path}: batch_size is {n!r}")
    full = tensors["sequences"].shape
    wide = tensors["response_mask"].shape
    for key, array in tensors.items():
        expected = full if key in ("sequences", "attention_mask") else wide
        if array.ndim != 2 or array.shape[0] != n or array.shape != expected:
            raise BadFile(Reason.UNREADABLE_FILE, f"{path}: inconsistent shapes: {key} is {array.shape}, expected "
                                                  f"({n}, {expected[1] if len(expected) > 1 else '?'}) "
                                                  f"(batch_size {n})")
    pad = metadata.get("pad_size", 0)
    if type(pad) is not int or not 0 <= pad <= n:
        raise BadFile(Reason.UNREADABLE_FILE, f"{path}: metadata pad_size is {pad!r} for a batch of {n} rows")
    group = _groups(path, metadata, n - pad)
    group = np.concatenate([group, np.arange(pad, dtype=np.int64) + (int(group.max()) + 1 if len(group) else 0)])

    response = tensors["response_mask"] != 0
    loss_mask = tensors["loss_mask"]
    trainable = (loss_mask != 0) & response
    # the advantage at the row's first trainable token; a row with none (its loss masked whole): its first
    # response token's (SkyRL broadcasts one value over the response); no response token: null
    first = np.where(trainable.any(axis=1), trainable.argmax(axis=1), response.argmax(axis=1))
    advantage = tensors["advantages"][np.arange(n), first].astype(np.float64) if n else np.zeros(0)
    has_response = response.any(axis=1)

    mask_values = loss_mask[response]
    binary = bool(np.isin(mask_values, (0, 1)).all())
    columns = {
        "global_step": pa.array([step] * n, pa.int64()),
        "row_index": pa.array(np.arange(n, dtype=np.int64)),
        "group_index": pa.array(group),
        "rollout_id": pa.array(_rollouts(metadata, n)),
        "not_trained": pa.array([None] * (n - pad) + [f"padding row (pad_size {pad})"] * pad, pa.string()),
        "skyrl_advantage": pa.array(advantage, mask=~has_response),
        "tokens": _lists(path, tensors["sequences"].astype(np.int64, copy=False), tensors["attention_mask"] != 0),
        "response_length": pa.array(response.sum(axis=1).astype(np.int64)),
        # 0 or 1 as integers (the tool's mask); another value is kept as it is, and the tool refuses it
        "loss_mask": _lists(path, loss_mask.astype(np.int8) if binary else loss_mask, response),
    }
    for key, name in _RESPONSE_LISTS.items():
        if key in tensors:
            columns[name] = _lists(path, tensors[key].astype(np.float32, copy=False), response)
    return pa.table(columns)


def _groups(path: str, metadata: dict, rows: int) -> np.ndarray:
    """Each trained row's prompt group: its position in `policy_prompt_boundaries`, which must tile the rows.
    A batch dumped with its `uids` still in the metadata (SkyRL removes them first) is grouped by uid."""
    bounds = metadata.get("policy_prompt_boundaries")
    if bounds is None:
        uids = metadata.get("uids")
        if isinstance(uids, list) and len(uids) >= rows and all(isinstance(u, str) for u in uids[:rows]):
            first: dict[str, int] = {}
            return np.array([first.setdefault(u, len(first)) for u in uids[:rows]], dtype=np.int64)
        raise BadFile(Reason.MISSING_COLUMN, f"{path}: metadata has no policy_prompt_boundaries (SkyRL writes them "
                                             "since its #1719): the prompt groups are not in the file")
    group = np.empty(rows, dtype=np.int64)
    at = 0
    for index, bound in enumerate(bounds if isinstance(bounds, (list, tuple)) else [None]):
        if (not isinstance(bound, (list, tuple)) or len(bound) != 2 or any(type(b) is not int for b in bound)
                or bound[0] != at or not at < bound[1] <= rows):
            raise BadFile(Reason.GROUP_SIZES_MISMATCH, f"{path}: policy_prompt_boundaries[{index}] is {bound!r}; "
                                                       f"expected ({at}, end) with end <= {rows}, the rows before "
                                                       "the padding")
        group[at:bound[1]] = index
        at = bound[1]
    if at != rows:
        raise BadFile(Reason.GROUP_SIZES_MISMATCH, f"{path}: policy_prompt_boundaries end at row {at}; the batch "
                                                   f"has {rows} rows before its padding")
    return group


def _rollouts(metadata: dict, n: int) -> np.ndarray:
    """Each row's rollout: its position in the batch, or, when the metadata still holds step-wise training's
    `is_last_step` (SkyRL removes it before the dump), its trajectory (a run of steps ending at a last step)."""
    last = metadata.get("is_last_step")
    if isinstance(last, list) and len(last) == n and all(type(v) is bool for v in last):
        return np.concatenate([[0], np.cumsum(np.array(last[:-1], dtype=np.int64))]) if n else np.zeros(0, np.int64)
    return np.arange(n, dtype=np.int64)


def _lists(path: str, values: np.ndarray, keep: np.ndarray) -> pa.Array:
    """Each row's values where `keep` (row-major: in token order) as one list per row."""
    counts = keep.sum(axis=1, dtype=np.int64)
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    if offsets[-1] > np.iinfo(np.int32).max:
        raise BadFile(Reason.FILE_TOO_COSTLY, f"{path}: more than 2^31 values in one column")
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values[keep]))


# --------------------------------------------------------------------------- reading a file


def read_batch(path: str, raw: bytes | None, columns=None) -> tuple[pa.Table, dict]:
    """The batch at `path` (a local file) or in `raw` (a store's object's bytes) as rows; BadFile for every
    file that cannot be, naming it and what is wrong."""
    return pt_dumps.costs_its_file(path, _read_batch, path, raw, columns)


def _read_batch(path: str, raw: bytes | None, columns) -> tuple[pa.Table, dict]:
    if (raw is not None and not raw) or (raw is None and _local_size(path) == 0):
        raise BadFile(Reason.EMPTY_FILE, f"{path}: file is empty (0 bytes)")
    try:
        if raw is not None:
            state = load_batch(raw)
        else:  # read as the unpickler goes: the tensors' bytes are not held twice
            with open(path, "rb") as handle:
                state = load_batch(handle)
    except OSError as error:
        raise BadFile(Reason.UNREADABLE_FILE, f"{path}: cannot be read: {error}") from error
    except _Refused as error:
        raise BadFile(Reason.UNSAFE_PICKLE, f"{path}: refused: {error}; unpickling it could run code") from error
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError, AttributeError,
            UnicodeDecodeError, OverflowError) as error:
        raise BadFile(Reason.UNREADABLE_FILE,
                      f"{path}: corrupt or truncated SkyRL pickle: {pt_dumps.error_text(error)}") from error
    step = step_from_name(path)
    table = _rows_of(path, state, step)
    if columns is not None:
        table = table.select([c for c in table.column_names if c in columns])
    return table, {"step": step, "prompt_group_sizes": None}


def _local_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError as error:
        raise BadFile(Reason.UNREADABLE_FILE, f"{path}: cannot be read: {error}") from error


def read_batch_outcome(path: str, raw: bytes | None = None, columns=None) -> pt_dumps.DumpOutcome:
    """read_batch, its BadFile as a value (it travels back from a worker process as data)."""
    try:
        table, metadata = read_batch(path, raw, columns)
    except BadFile as bad:
        return pt_dumps.DumpOutcome(reason=bad.reason, message=bad.message)
    return pt_dumps.DumpOutcome(table, metadata)


def read(path: str, columns, options: ReadOptions) -> tuple[pa.Table, dict]:
    """On a worker process, bounded as a `.pt` dump's reading is (pt_dumps.bounds): an unpickler holds the
    GIL, and a hostile file costs that process, never the run. A daemonic process reads in itself."""
    raw = None if "://" not in path else read_bytes(path)
    if multiprocessing.current_process().daemon:
        return read_batch(path, raw, columns)
    seconds, memory = pt_dumps.bounds(len(raw) if raw is not None else _local_size(path))
    try:
        return processes_pool.run(max(1, options.processes), read_batch_outcome, path, raw, columns,
                                  seconds=seconds, memory=memory).unwrap()
    except processes_pool.Lost as lost:
        raise BadFile(Reason.FILE_TOO_COSTLY if lost.costly else Reason.UNREADABLE_FILE, f"{path}: {lost}") from lost


def ends_whole(handle, size: int) -> bool:
    """A pickle ends with its STOP opcode (`.`): SkyRL writes the file in place, so `relabel watch` waits for it.
    (A pause right after a `.` byte inside the data passes this check; the stable size still has to hold.)"""
    return tail(handle, size, 1) == pickle.STOP


FORMAT = Format("skyrl", matches=matches, read=read, plan=planned_by_name(step_from_name),
                step_from_name=step_from_name, reads_on_processes=True, ends_whole=ends_whole,
                stored_advantage="skyrl_advantage",
                no_rescoring="SkyRL's batch holds no rewards and no text to score: its own advantages pass "
                             "through (docs/formats.md, SkyRL)",
                preset=("--column=reward=skyrl_advantage", "--semantics=group-index", "--estimator=none"))
