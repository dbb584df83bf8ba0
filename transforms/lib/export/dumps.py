"""`relabel export`: a training-rows directory -> slime / miles debug rollout dumps, one `<rollout_id>.pt` a batch.

Each dump has the layout `--save-debug-rollout-data` writes (`{"rollout_id", "samples"}`, miles with
`"metadata"` between them), its samples in their batch order, every field as it was read (rows of .pt
inputs are rebuilt through their dump layout, dump_layout.py), and three fields relabelled: `reward` =
the row's advantage, `metadata["raw_reward"]` = its raw reward, `loss_mask` = the final training mask.
Dead-lettered and filtered rows are not exported; each batch's losses are counted by reason.

The output directory follows `relabel run`'s rules: files committed by rename, an options record
written first (what an interrupted export resumes with), the manifest last (a rerun over a complete
output is a no-op), and an output made with other options is refused unless --overwrite.
No Beam here apart from the file layer (filesystem.py).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rollout_relabel import schemas
from rollout_relabel.transforms.core.estimators import Estimator
from rollout_relabel.transforms.lib.errors import DamagedOutput, ExitCode, InputChanged, NotOurOutput, UsageError
from rollout_relabel.transforms.lib.io import dump_layout, filesystem, formats
from rollout_relabel.transforms.lib.output import output_files
from rollout_relabel.transforms.lib.output.manifest import MANIFEST_NAME
from rollout_relabel.transforms.lib.output.output_dir import delete_own_files, is_run_manifest
from rollout_relabel.transforms.lib.output.plain_values import plain_table
from rollout_relabel.transforms.lib.settings import PROJECT, project_version

LAYOUTS = ("slime", "miles")
OPTIONS_NAME = "_export.json"   # written first: the options the directory's dumps are made with
EXPORT_VERSION = 1
DUMP_NAME = re.compile(r"-?[0-9]+\.pt")  # <rollout_id>.pt: the only dump names export writes (or deletes)
ADDED = (*(f.name for f in schemas.TRAINING_COLUMNS if f.name != "loss_mask"), schemas.LOSS_WEIGHT.name)


@dataclass(frozen=True)
class ExportSettings:
    input: str
    output: str
    to: str
    force: bool = False
    overwrite: bool = False
    version: str = field(default_factory=project_version)
    # --fold-row-weight: the exported reward is advantage x loss_weight (docs/semantics.md, "Row weights")
    fold_row_weight: bool = False

    def __post_init__(self):
        if self.to not in LAYOUTS:
            raise UsageError(f"--to {self.to!r}: choose one of {', '.join(LAYOUTS)}")


@dataclass
class Part:
    """One part file of the training rows: the input it came from, its dump layout when a .pt dump."""
    path: str           # the input file
    output: str         # part-<stem>.parquet
    layout: dict | None


@dataclass
class Batch:
    """One training step's rows, as the run batched them; one dump."""
    key: str                                     # the run's batch key: step=N or file=PATH
    rollout_id: int | None
    parts: list[tuple[Part, list[int] | None]]   # (part, its rows of this batch; None: all)
    rows: int = 0                                # rows exported
    dead: Counter = field(default_factory=Counter)
    filtered: Counter = field(default_factory=Counter)

    @property
    def number(self) -> int:
        """The dump's rollout_id, once every batch has one (`_number` gives each batch without a step one)."""
        if self.rollout_id is None:
            raise ValueError(f"the batch {self.key} has no rollout_id yet")
        return self.rollout_id

    @property
    def file(self) -> str:
        return f"{self.rollout_id}.pt"

    @property
    def sources(self) -> list[str]:
        return [part.path for part, _ in self.parts]


@dataclass
class ExportPlan:
    run: dict                      # the run record of the training rows' manifest
    input_digest: str              # sha256 of that manifest
    batches: list[Batch]           # in rollout_id order
    lost_batches: list[Batch]      # batches none of whose rows was written
    lost_inputs: list[dict]        # inputs the run could not read: {path, reason}
    numbered: bool                 # no batch had a step: numbered from 0 in input order
    run_fingerprint: str | None = None  # the run's options fingerprint: every part read must carry it


# --- planning --------------------------------------------------------------------------------------------


def plan_export(input_dir: str) -> ExportPlan:
    """The batches of a complete training-rows directory, their rollout ids and their losses."""
    manifest_path = filesystem.join(input_dir, MANIFEST_NAME)
    if not filesystem.exists(manifest_path):
        raise UsageError(f"--input {input_dir}: no {MANIFEST_NAME}: not a complete `relabel run` output "
                         "(a run writes its manifest last; rerun an interrupted one)")
    raw, manifest = read_input_manifest(input_dir)
    if (manifest.get("watch") or {}).get("state", "stopped") != "stopped":
        raise UsageError(f"--input {input_dir}: `relabel watch` is still writing it; export once the watch stopped")

    parts, lost_inputs = [], []
    for entry in manifest["inputs"]:
        if not entry.get("output"):
            lost_inputs.append({"path": entry["path"], "reason": entry.get("unreadable") or "no rows written"})
            continue
        parts.append(_part(input_dir, entry, manifest.get("fingerprint")))

    batches: dict[str, Batch] = {}
    for part in parts:
        for key, rollout_id, rows, count in _batches_of(input_dir, part):
            batch = batches.setdefault(key, Batch(key, rollout_id, []))
            batch.parts.append((part, rows))
            batch.rows += count
    lost = _losses(input_dir, manifest, batches)
    kept = [b for b in batches.values() if b.rows]
    numbered = _number(kept)
    _refuse_shared_ids(kept)
    return ExportPlan(manifest["run"], hashlib.sha256(raw).hexdigest(), sorted(kept, key=lambda b: b.number),
                      sorted(lost + [b for b in batches.values() if not b.rows], key=lambda b: b.key),
                      lost_inputs, numbered, manifest.get("fingerprint"))


def read_input_manifest(input_dir: str) -> tuple[bytes, dict]:
    """The training rows' manifest (its bytes and content); NotOurOutput when it is not a run's."""
    with filesystem.open_read(filesystem.join(input_dir, MANIFEST_NAME)) as handle:
        raw = handle.read()
    try:
        manifest = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        manifest = None
    if not is_run_manifest(manifest):
        raise NotOurOutput(f"--input {input_dir}: {MANIFEST_NAME} is not an output of relabel run (damaged or "
                           "another tool's); rerun `relabel run --overwrite` into it")
    return raw, manifest


def damaged(input_dir: str, name: str, error: Exception) -> DamagedOutput:
    return DamagedOutput(f"--input {input_dir}: {name} is damaged ({type(error).__name__}: "
                         f"{str(error).splitlines()[0] if str(error) else 'unreadable'}); rerun the same "
                         "`relabel run` into it to write it again, then export")


def _footer(input_dir: str, name: str, step: bool = False):
    """(metadata, the step column or None) of the committed Parquet file input_dir/name; DamagedOutput when
    it cannot be read as one."""
    try:
        with filesystem.open_read(filesystem.join(input_dir, name)) as handle:
            parquet = pq.ParquetFile(handle)
            steps = None
            if step and "step" in parquet.schema_arrow.names:
                steps = parquet.read(columns=["step"]).column("step").to_pylist()
            return parquet.metadata, steps
    except (pa.ArrowException, OSError, ValueError) as error:
        raise damaged(input_dir, name, error) from None


def _part(input_dir: str, entry: dict, fingerprint: str | None) -> Part:
    path = filesystem.join(input_dir, entry["output"])
    if not filesystem.exists(path):
        raise UsageError(f"--input {input_dir}: {entry['output']} is listed in the manifest but missing")
    metadata = _footer(input_dir, entry["output"])[0].metadata or {}
    try:
        lineage = json.loads(metadata.get(output_files.LINEAGE_KEY, b"{}"))
    except ValueError as error:
        raise damaged(input_dir, entry["output"], error) from None
    if lineage.get("fingerprint") != fingerprint:
        raise UsageError(f"--input {input_dir}: {entry['output']} was not written by the run of its manifest "
                         f"(fingerprint {lineage.get('fingerprint')} != {fingerprint})")
    layout = dump_layout.read(metadata)
    if layout is None and _carries_layout(entry["path"]):
        raise UsageError(f"--input {input_dir}: {entry['output']} (from {entry['path']}) carries no dump layout: "
                         "it was written before relabel export existed; rerun `relabel run --overwrite` on the dumps")
    if layout is None:  # a dump's rows go back as they were read; rows of other layouts become samples
        _refuse_text_only(input_dir, entry)
    return Part(entry["path"], entry["output"], layout)


def _refuse_text_only(input_dir: str, entry: dict) -> None:
    """slime's and miles' samples are token ids (`tokens`: the prompt's and the response's); Parquet or JSONL
    rows without them (text-only layouts: verl, AReaL, rllm and ROLL dumps keep the prompt and response as
    text; prime-rl's token_ids interleave a branch's turns) would become samples with nothing to train on.
    Refused before anything is written."""
    try:
        with filesystem.open_read(filesystem.join(input_dir, entry["output"])) as handle:
            parquet = pq.ParquetFile(handle)
            if not parquet.metadata.num_rows:
                return  # no row to export (its input's rows were all dead-lettered)
            names = parquet.schema_arrow.names
            column = parquet.read(columns=["tokens"]).column("tokens") if "tokens" in names else None
    except (pa.ArrowException, OSError, ValueError) as error:
        raise damaged(input_dir, entry["output"], error) from None
    kind = column.type if column is not None else None
    ids = kind is not None and (pa.types.is_list(kind) or pa.types.is_large_list(kind)) \
        and pa.types.is_integer(kind.value_type)
    if ids and column is not None and column.null_count == 0 and (not len(column) or pc.min(
            pc.list_value_length(column)).as_py() > 0):
        return
    what = ("no `tokens` column" if column is None else f"`tokens` of type {kind}, not token ids" if not ids
            else "rows without token ids in `tokens`")
    raise UsageError(f"--input {input_dir}: {entry['output']} (from {entry['path']}) has {what}: slime and miles "
                     "train on a sample's `tokens` (its prompt's, then its response's), which these rows do not "
                     "hold (verl, AReaL, rllm and ROLL keep text; prime-rl's branches interleave prompt and "
                     "completion tokens over turns in `token_ids`); nothing was exported")


def _carries_layout(path: str) -> bool:
    """Whether the input's format writes a dump layout (its parts without one predate relabel export)."""
    found = formats.detect(path)
    return found is not None and found.dump_layout


def _batches_of(input_dir: str, part: Part):
    """(batch key, rollout id, rows of the part (None: all), row count) for each batch of the part's rows."""
    if part.layout is not None:  # a dump: one batch
        rollout_id = dump_layout.top_level(part.layout).get("rollout_id")
        yield (f"file={part.path}", rollout_id if _is_int(rollout_id) else None, None,
               len(dump_layout.kept_rows(part.layout)))
        return
    metadata, steps = _footer(input_dir, part.output, step=True)
    if steps is None:
        yield f"file={part.path}", None, None, metadata.num_rows
        return
    rows: dict[int, list[int]] = {}
    for position, step in enumerate(steps):
        rows.setdefault(step, []).append(position)
    for step, positions in rows.items():
        yield f"step={step}", step, positions if len(positions) < len(steps) else None, len(positions)


def _losses(input_dir: str, manifest: dict, batches: dict[str, Batch]) -> list[Batch]:
    """Count each batch's dead and filtered rows by reason; the batches known only from them (all rows lost)."""
    only_lost: dict[str, Batch] = {}
    for kind in ("dead", "filtered"):
        records = []
        for path in _excluded_files(input_dir, manifest.get("dead_letters" if kind == "dead" else "filtered")):
            try:
                with filesystem.open_read(path) as handle:
                    records += pq.read_table(handle, columns=["source", "row", "batch", "reason"]).to_pylist()
            except (pa.ArrowException, OSError, ValueError) as error:
                raise damaged(input_dir, path.replace("\\", "/").rsplit("/", 1)[-1], error) from None
        for record in records:
            if record["row"] is None:  # a whole file: among the lost inputs
                continue
            key = record["batch"]
            batch = batches.get(key) or only_lost.setdefault(key, Batch(key, _step_of(key), []))
            getattr(batch, kind)[record["reason"]] += 1
    return list(only_lost.values())


def _excluded_files(input_dir: str, section: dict | None) -> list[str]:
    """_dead_letters.parquet (relabel run), or the per-input files under _dead_letters/ (relabel watch)."""
    name = section.get("file") if isinstance(section, dict) else None
    if not name or not isinstance(name, str) or ".." in name.split("/") or name.startswith("/"):
        return []
    if name.endswith("/"):
        found = filesystem.match_in(filesystem.join(input_dir, name.rstrip("/")), "*.parquet")
        return sorted(m.path for m in found if not m.path.replace("\\", "/").rsplit("/", 1)[-1].startswith("."))
    return [filesystem.join(input_dir, name)]


def _step_of(key: str):
    step = key.removeprefix("step=")
    return int(step) if step != key and step.lstrip("-").isdigit() else None


def _number(batches: list[Batch]) -> bool:
    """Give batches without a step (or dump rollout_id) one, when none has: 0, 1, ... in input order."""
    missing = [b for b in batches if b.rollout_id is None]
    if not missing:
        return False
    if len(missing) < len(batches):
        raise UsageError(f"the batch of {missing[0].sources[0]} has no step (nor a dump rollout_id) while other "
                         "batches have one: its dump cannot be named; export the two kinds separately")
    for number, batch in enumerate(sorted(batches, key=lambda b: b.sources[0])):
        batch.rollout_id = number
    return True


def _refuse_shared_ids(batches: list[Batch]) -> None:
    seen: dict[int, Batch] = {}
    for batch in sorted(batches, key=lambda b: b.key):
        other = seen.setdefault(batch.number, batch)
        if other is not batch:
            raise UsageError(f"two batches would both be written as {batch.file}: {other.key} and {batch.key}; "
                             "export them into separate directories")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def refuse_terminal_reward_estimators(run: dict, force: bool) -> None:
    """slime and miles feed the reward of some estimators (their row's `trainer_reward`) to GAE or discounted
    returns as a terminal reward: the advantage exported as that reward would be another training signal."""
    estimator = run.get("estimator")
    if force or estimator not in tuple(Estimator):  # a name this version does not know has no row to refuse
        return
    trainer_reward = Estimator(estimator).facts.trainer_reward
    if trainer_reward is not None:
        raise UsageError(
            f"the training rows were made for estimator {estimator}: slime and miles place a {estimator} reward "
            f"at the last response token as a terminal reward ({trainer_reward}), so an advantage written as the "
            "reward is not the same training signal; pass --force to export anyway (docs/training.md)")


def refuse_is_weights(run: dict) -> None:
    """Rows made with --rollout-is hold per-token IS weights, and a slime or miles Sample has no field that
    carries a per-token loss weight into the trainer's loss (slime/utils/types.py at the commits
    docs/training.md cites: loss_mask, rollout_log_probs, teacher_log_probs, none a weight). Exported, the
    weights would be silently lost; the rejection needs no field: it is folded into the exported loss_mask."""
    correction = run.get("rollout_correction_resolved") or {}
    if correction.get("rollout_is") is not None:
        raise UsageError(
            f"the training rows hold IS weights (--rollout-is {correction['rollout_is']}), and a slime/miles Sample "
            "has no per-token weight field to carry them: rerun with --rollout-is none to export the rejection "
            "alone (it is in loss_mask), or let the trainer weigh (--use-tis) (docs/off-policy.md)")


# --- one batch's dump ------------------------------------------------------------------------------------


def build_dump(input_dir: str, batch: Batch, to: str, read=None, fold_row_weight: bool = False) -> dict:
    """The batch's dump as the trainer's --save-debug-rollout-data writes it, relabelled. `fold_row_weight`:
    each reward is the row's advantage times its loss_weight (slime and miles have no per-sample weight; this
    weighs the policy-gradient term only, not a KL or entropy term)."""
    read = read or (lambda output: read_part(input_dir, output))
    samples: list[dict] = []
    top: dict = {}
    for part, rows in batch.parts:
        table = read(part.output)
        if rows is not None:
            table = table.take(pa.array(rows, pa.int64()))
        if part.layout is None:  # a Parquet row's values as types torch.load(weights_only=True) gives back
            table = plain_table(table)
        columns = {name: table.column(name).to_pylist() for name in table.column_names}
        rewards = columns["advantage"]
        if fold_row_weight:
            if schemas.LOSS_WEIGHT.name not in columns:
                raise UsageError(f"--fold-row-weight: {part.output} has no loss_weight column; make the training "
                                 "rows with --row-weight rollout|tokens")
            rewards = [a * w for a, w in zip(rewards, columns[schemas.LOSS_WEIGHT.name])]
        if part.layout is not None:
            restored = dump_layout.restore_samples(part.layout, columns)
            top = dump_layout.top_level(part.layout)
        else:
            restored = [_parquet_sample(columns, i) for i in range(table.num_rows)]
        for i, sample in enumerate(restored):
            _relabel(sample, rewards[i], columns["raw_reward"][i], columns["loss_mask"][i], batch)
        samples += restored
    dump: dict[str, object] = {"rollout_id": batch.rollout_id}
    if to == "miles":
        metadata = top.get("metadata")
        dump["metadata"] = _kept_group_sizes(metadata if isinstance(metadata, dict) else {}, batch)
    dump["samples"] = samples
    return dump


def read_part(input_dir: str, output: str, fingerprint: str | None = None) -> pa.Table:
    """A part file's rows; with fingerprint, InputChanged unless the run of that fingerprint wrote it (a run
    replaced the part since the export planned)."""
    try:
        with filesystem.open_read(filesystem.join(input_dir, output)) as handle:
            table = pq.read_table(handle)
    except (pa.ArrowException, OSError, ValueError) as error:
        raise damaged(input_dir, output, error) from None
    if fingerprint is not None:
        lineage = json.loads((table.schema.metadata or {}).get(output_files.LINEAGE_KEY, b"{}"))
        if lineage.get("fingerprint") != fingerprint:
            raise InputChanged(f"--input {input_dir}: {output} was rewritten by another run while exporting "
                               f"(fingerprint {lineage.get('fingerprint')} != {fingerprint}); nothing more is "
                               "committed: rerun the export")
    return table


def _parquet_sample(columns: dict[str, list], i: int) -> dict:
    """A Parquet row as a sample: its columns (the run's training columns apart), and the keys
    Sample.from_dict cannot do without."""
    sample = {name: values[i] for name, values in columns.items() if name not in ADDED}
    if sample.get("status") is None:
        sample["status"] = "truncated" if columns["truncated"][i] else "completed"
    return sample


def _relabel(sample: dict, advantage: float, raw_reward: float, loss_mask: list[int], batch: Batch) -> None:
    metadata = sample.get("metadata")
    if metadata is None:
        metadata = {}
    elif not isinstance(metadata, dict):
        raise UsageError(f"batch {batch.key}: a sample's metadata is a {type(metadata).__name__}, not a dict: "
                         "metadata['raw_reward'] cannot be set")
    sample["reward"] = advantage
    metadata = metadata.copy()
    metadata["raw_reward"] = raw_reward
    sample["metadata"] = metadata
    sample["loss_mask"] = loss_mask


def _kept_group_sizes(metadata: dict, batch: Batch) -> dict:
    """miles' metadata, its prompt_group_sizes counting only the rows exported (a group may drop to 0)."""
    sizes = metadata.get("prompt_group_sizes")
    part, rows = batch.parts[0]
    if not isinstance(sizes, list) or part.layout is None or "kept" not in part.layout:
        return metadata
    if sum(sizes) != part.layout["rows"]:
        return metadata
    group_of = [g for g, size in enumerate(sizes) for _ in range(size)]
    kept = Counter(group_of[row] for row in part.layout["kept"])
    return dict(metadata, prompt_group_sizes=[kept.get(g, 0) for g in range(len(sizes))])


def dump_bytes(dump: dict) -> bytes:
    import torch  # only to write the dumps

    buffer = io.BytesIO()
    torch.save(dump, buffer)
    return buffer.getvalue()


# --- the output directory --------------------------------------------------------------------------------


def fingerprint(settings: ExportSettings, plan: ExportPlan) -> str:
    """What decides the dumps' bytes: the layout, the training rows (their manifest) and the project version."""
    record = {"to": settings.to, "input_manifest_sha256": plan.input_digest, "export_version": EXPORT_VERSION,
              "project": PROJECT, "project_version": settings.version}
    if settings.fold_row_weight:  # other dumps, another fingerprint; exports without it keep theirs
        record["fold_row_weight"] = True
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]


def same_place(a: str, b: str) -> bool:
    """Whether two directories are one: local paths compared with every symlink resolved."""
    if "://" in a or "://" in b:
        return a.rstrip("/") == b.rstrip("/")
    return os.path.realpath(a) == os.path.realpath(b)


def check_input_unchanged(input_dir: str, plan: ExportPlan) -> None:
    """At commit: the training rows' manifest is still the one planned from (InputChanged otherwise)."""
    raw, _ = read_input_manifest(input_dir)
    if hashlib.sha256(raw).hexdigest() != plan.input_digest:
        raise InputChanged(f"--input {input_dir}: its {MANIFEST_NAME} changed while exporting (another run "
                           "wrote it); nothing more is committed: rerun the export")


def read_json(output: str, name: str) -> dict | None:
    return output_files.read_json(filesystem.join(output, name))


def read_own_json(output: str, name: str, overwrite: bool) -> dict | None:
    """The export's manifest or options record in output; None when absent. A file there that is not one
    is refused (NotOurOutput) unless --overwrite, which replaces it (None)."""
    content: dict | str | None
    try:
        content = read_json(output, name)
    except (ValueError, UnicodeDecodeError):
        content = "damaged"
    if content is None or (isinstance(content, dict) and isinstance(content.get("fingerprint"), str)
                           and all(isinstance(b, dict) for b in content.get("batches", []))
                           and isinstance(content.get("batches", []), list)
                           and isinstance(content.get("files", []), list)):
        return content
    if overwrite:
        return None
    raise NotOurOutput(f"{filesystem.join(output, name)} is not an output of relabel export; pass --overwrite "
                       "to replace it")


def own_dump_names(names) -> list[str]:
    """Those of names (read from the output's records) that export writes: <rollout_id>.pt, nothing else."""
    return [n for n in names if isinstance(n, str) and DUMP_NAME.fullmatch(n)]


def remove_export_outputs(output: str, names) -> None:
    """The manifest first (nothing looks complete meanwhile), the options record, temporary files, and
    those of `names` that are export's own dump names (own_dump_names): never another file, nor a folder."""
    paths = [filesystem.join(output, n) for n in dict.fromkeys([MANIFEST_NAME, OPTIONS_NAME,
                                                                 *own_dump_names(names)])]
    paths += [m.path for m in filesystem.match_in(output, output_files.TEMP_PREFIX + "*")]
    delete_own_files(paths)


def write_json(output: str, name: str, content: dict) -> None:
    output_files.write_bytes_atomically((json.dumps(content, indent=2, sort_keys=True) + "\n").encode(), output, name)


def build_manifest(settings: ExportSettings, plan: ExportPlan, fingerprint_: str) -> dict:
    """What the export wrote: per batch its file, samples, sources and losses; the inputs it could not export."""
    batches = [{
        "rollout_id": b.rollout_id, "file": b.file, "samples": b.rows, "sources": b.sources,
        "dead": dict(sorted(b.dead.items())), "filtered": dict(sorted(b.filtered.items())),
        "short": bool(b.dead or b.filtered),
    } for b in plan.batches]
    lost = [{"batch": b.key, "dead": dict(sorted(b.dead.items())), "filtered": dict(sorted(b.filtered.items()))}
            for b in plan.lost_batches]
    return {
        "export_version": EXPORT_VERSION,
        "fingerprint": fingerprint_,
        "export": {"to": settings.to, "input": settings.input, "input_manifest_sha256": plan.input_digest,
                   "force": settings.force, "numbered": plan.numbered, "project": PROJECT,
                   "project_version": settings.version},
        "run": plan.run,
        "counts": {
            "batches": len(batches), "samples": sum(b["samples"] for b in batches),
            "samples_dead": sum(sum(b.dead.values()) for b in plan.batches + plan.lost_batches),
            "samples_filtered": sum(sum(b.filtered.values()) for b in plan.batches + plan.lost_batches),
            "batches_short": sum(b["short"] for b in batches), "batches_lost": len(lost),
            "inputs_lost": len(plan.lost_inputs),
        },
        "batches": batches,
        "lost_batches": lost,
        "lost_inputs": plan.lost_inputs,
    }


def exit_code(manifest: dict) -> ExitCode:
    """DEAD_LETTERS when the trainer will miss rows the run read (dead rows, lost batches or inputs);
    filtered rows alone were dropped on purpose (--drop-uniform-groups)."""
    counts = manifest["counts"]
    lost = counts["samples_dead"] or counts["batches_lost"] or counts["inputs_lost"]
    return ExitCode.DEAD_LETTERS if lost else ExitCode.OK
