"""difficulty(argv): `relabel difficulty`: runs -> pass-rate table per prompt, added to run by run.

Each --input path is one run (a Delta table: each of its `run` partitions). A run is rollouts (any format
the other commands read, relabelled with the labeling flags to find its units), the training rows of a
`relabel run` output folder, or a Delta table `relabel run --output-format delta` wrote (training rows
are read as the run that wrote them read its input: its options record says how). Batches and prompt
groups never span runs: each run is planned on its own.

The table's record (the Parquet file's metadata, or each Delta commit's info) names every run counted in
it and a fingerprint of its files. A rerun adds the runs it does not hold and writes the whole table in
one commit (one file renamed into place, or one Delta commit); a run it holds with the same files is not
counted again; a run whose files changed since is a usage error (--overwrite rebuilds the table from the
given inputs alone).
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
from dataclasses import dataclass, field

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq

from rollout_relabel.pipeline import worker_output
from rollout_relabel.pipeline.compare_spec import labeling_from_record
from rollout_relabel.pipeline.local_threads import create_reshuffles
from rollout_relabel.pipeline.parse import Parsed, parse
from rollout_relabel.pipeline.settings_from_flags import labeling
from rollout_relabel.transforms.lib.difficulty import keep as keep_lib
from rollout_relabel.transforms.lib.difficulty import table as difficulty_table
from rollout_relabel.transforms.lib.difficulty.difficulty_settings import (
    EXISTING,
    ROLLOUTS,
    TRAINING_ROWS,
    DifficultySettings,
)
from rollout_relabel.transforms.lib.difficulty.units import Work
from rollout_relabel.transforms.lib.errors import ExitCode, UsageError
from rollout_relabel.transforms.lib.io import filesystem, formats
from rollout_relabel.transforms.lib.io.input_file import InputFile
from rollout_relabel.transforms.lib.io.inputs import expand_inputs
from rollout_relabel.transforms.lib.io.plan import group_by_batch_sharing
from rollout_relabel.transforms.lib.output import delta_table, lease, output_files
from rollout_relabel.transforms.lib.output.manifest import MANIFEST_NAME
from rollout_relabel.transforms.lib.output.output_dir import PART_PATTERN, is_own_name, make_writable
from rollout_relabel.transforms.tally_difficulty import TallyDifficulty
from rollout_relabel.transforms.write_difficulty_table import WriteDifficultyTable, counts_name

TABLE_NAME = "part-00000.parquet"  # the Parquet output's one table file (the rename is its commit)
KEPT_NAME = "kept.parquet"         # --keep's default file in a Parquet output
DELTA_LOG = "_delta_log"
PACK_BYTES = 64 << 20  # stored input bytes an element of the pipeline (a pack of works) holds at most


@dataclass(frozen=True)
class RunInput:
    """One run: its name in the table, where it was read from, how, and its files."""
    name: str
    path: str
    kind: str
    labeling: object
    files: tuple  # InputFile
    record: dict = field(default_factory=dict)  # what the table's record says of it

    def fingerprint(self) -> str:
        listing = [[f.path, f.size, f.mtime] for f in self.files]
        return hashlib.sha256(json.dumps(listing).encode()).hexdigest()[:16]

    def entry(self) -> dict:
        return {"input": self.path, "kind": self.kind, "files": len(self.files), "fingerprint": self.fingerprint(),
                "labeling": self.labeling.record()}


@dataclass
class DifficultyOutcome:
    exit_code: ExitCode
    output: str
    added: list[str]
    kept_runs: list[str]
    counts: dict
    rows: int
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        c = self.counts
        lines = list(self.notes)
        lines.append(f"runs        {len(self.added)} added ({', '.join(self.added) or 'none'}), "
                     f"{len(self.kept_runs)} already in the table")
        if c:
            lines.append(f"files       {c['files']} read ({c['files_unreadable']} unreadable)")
            lines.append(f"rows        {c['rows_in']} read, {c['rows_dead']} dead (not counted)")
            lines.append(f"units       {c['units']} counted ({c['units_without_key']} without a prompt key, "
                         "not counted)")
        lines.append(f"table       {self.rows} rows -> {self.output}")
        return "\n".join(lines)


def settings_of(args: argparse.Namespace) -> DifficultySettings:
    if not args.inputs:
        raise UsageError("--input is required (one path a run)")
    if not args.output:
        raise UsageError("--output is required (a folder, or a Delta table with --output-format delta)")
    if args.keep_output and not args.keep:
        raise UsageError("--keep-output names where --keep writes; give --keep EXPR too")
    if args.keep and args.output_format == "delta" and not args.keep_output:
        raise UsageError("--keep with --output-format delta needs --keep-output FILE (a Delta table's folder "
                         "holds only the table's files)")
    try:
        return DifficultySettings(
            inputs=tuple(args.inputs), output=args.output.rstrip("/") or args.output, labeling=labeling(args),
            prompt_key=args.prompt_key, pass_threshold=args.pass_threshold, ks=tuple(args.ks or ()),
            by=args.by, output_format=args.output_format,
            storage_options=tuple(sorted(delta_table.storage_flags(args.storage_options).items())), keep=args.keep,
            keep_output=args.keep_output, plot=args.plot, overwrite=args.overwrite, device=args.device,
            max_file_bytes=args.max_file_bytes)
    except ValueError as error:
        raise UsageError(str(error)) from error


def keep_columns(settings: DifficultySettings) -> tuple[str, ...]:
    """The columns --keep may name: the table's numeric ones."""
    names = ("rollouts", "passes", "pass_rate", "mean_reward",
             *(difficulty_table.pass_at_k_column(k) for k in settings.ks), "runs", "first_step", "last_step")
    return names + ((difficulty_table.STEP,) if settings.by == "step" else ())


def difficulty(argv: list[str], test_pipeline: beam.Pipeline | None = None) -> DifficultyOutcome:
    parsed = parse("difficulty", argv)
    settings = settings_of(parsed.args)
    keep = keep_lib.parse(settings.keep, keep_columns(settings)) if settings.keep else None
    filesystem.use_options(parsed.options)
    runs = resolve_runs(settings)
    if settings.output_format == "delta":
        return _into(parsed, settings, runs, keep, test_pipeline)
    make_writable(settings.output)
    with lease.holding(settings.output, "difficulty"):
        return _into(parsed, settings, runs, keep, test_pipeline)


def _into(parsed: Parsed, settings: DifficultySettings, runs: list[RunInput], keep, test_pipeline) -> DifficultyOutcome:
    existing = None if settings.overwrite else read_existing(settings)
    record_runs: dict = {}
    if existing is not None:
        record, files = existing
        if record.get("options") != settings.table_options():
            raise UsageError(f"{settings.output} holds a table made with other options ({record.get('options')} != "
                             f"{settings.table_options()}); pass --overwrite to rebuild it from these inputs")
        record_runs = dict(record.get("runs") or {})
    new, held = [], []
    for run in runs:
        before = record_runs.get(run.name)
        if before is None:
            new.append(run)
        elif before.get("fingerprint") == run.fingerprint():
            held.append(run.name)
        else:
            raise UsageError(f"run {run.name} ({run.path}) changed since the table counted it ({before.get('files')} "
                             f"files, fingerprint {before.get('fingerprint')}; now {len(run.files)} files, "
                             f"{run.fingerprint()}): its units cannot be taken out of the table; pass --overwrite "
                             "to rebuild the table from the inputs given")
    record = {"kind": "difficulty", "table_version": difficulty_table.TABLE_VERSION,
              "options": settings.table_options(), "k": list(settings.ks),
              "runs": dict(sorted({**record_runs, **{r.name: r.entry() for r in new}}.items()))}
    notes = []
    if not new and existing is not None and existing[0].get("k") == list(settings.ks):
        notes.append("already complete: every run given is in the table with the same files; nothing to add")
        rows = sum(_file_rows(entry.path) for entry in existing[1])
        counts = {}
    else:
        elements = packs(new)
        if existing is not None:
            elements.insert(0, (Work("", EXISTING, settings.labeling, tuple(existing[1])),))
        staging, name = staging_place(settings, record)
        pipeline = test_pipeline if test_pipeline is not None else beam.Pipeline(options=parsed.options)
        tallied = (pipeline | "ListPacks" >> beam.Create(elements, reshuffle=create_reshuffles(parsed.options))
                   | "TallyDifficulty" >> TallyDifficulty(settings))
        _ = tallied | "WriteDifficultyTable" >> WriteDifficultyTable(settings, staging, name, record)
        with worker_output.logged():
            pipeline.run().wait_until_finish()
        rows = commit(settings, filesystem.join(staging, name))
        counts_path = filesystem.join(staging, counts_name(name))
        counts = output_files.read_json(counts_path) or {}
        filesystem.delete_existing([counts_path])
    # the committed table is read back only for what needs its rows
    table = read_table(settings, read_existing(settings)) if keep is not None or settings.plot else None
    if keep is not None:
        kept, target = write_kept(settings, keep, table)
        notes.append(f"kept        {kept} of {rows} rows -> {target}")
    if settings.plot:
        from rollout_relabel.transforms.lib.difficulty.plot import write_plot
        write_plot(table, settings.plot)
        notes.append(f"plot        {settings.plot}")
    dead = counts.get("rows_dead", 0) or counts.get("files_unreadable", 0)
    return DifficultyOutcome(ExitCode.DEAD_LETTERS if dead else ExitCode.OK, settings.output,
                             [r.name for r in new], held, counts, rows, notes)


def _deltalake():
    try:
        import deltalake
    except ImportError:
        raise UsageError("Delta tables need deltalake: "
                         "pip install -c constraints.txt 'rollout-relabel[delta]'") from None
    return deltalake


def run_name(path: str) -> str:
    """A run's name: its folder's (or file's) name."""
    return path.rstrip("/").rsplit("/", 1)[-1] or path


def resolve_runs(settings: DifficultySettings) -> list[RunInput]:
    """Every run the inputs hold, each named once."""
    runs: list[RunInput] = []
    for path in settings.inputs:
        if filesystem.match(filesystem.join(path, DELTA_LOG, "*.json")):  # object stores have no folders
            runs += _delta_runs(path, settings)
        elif filesystem.exists(filesystem.join(path, MANIFEST_NAME)):
            runs.append(_training_rows_run(path, settings))
        else:
            files = expand_inputs([path], settings.output)
            if not files:
                raise UsageError(f"--input {path}: no rollout files ({', '.join(formats.suffixes())}) found")
            runs.append(RunInput(run_name(path), path, ROLLOUTS, settings.labeling, tuple(files)))
    seen: dict[str, str] = {}
    owner: dict[str, str] = {}
    for run in runs:
        if run.name in seen:
            raise UsageError(f"--input {seen[run.name]} and {run.path} are both named run {run.name!r}: runs are "
                             "named after their folder; give each run a folder of its own name")
        seen[run.name] = run.path
        for f in run.files:
            if f.path in owner:
                raise UsageError(f"{f.path} is in run {owner[f.path]} and in run {run.name}: a file belongs to one "
                                 "run (give runs folders that do not hold one another)")
            owner[f.path] = run.name
    return runs


def _training_rows_run(path: str, settings: DifficultySettings) -> RunInput:
    """A `relabel run` output folder: its part files only (never its dead letters, filtered rows or
    manifest), read with the options its manifest records."""
    manifest = output_files.read_json(filesystem.join(path, MANIFEST_NAME))
    if not isinstance(manifest, dict) or not isinstance(manifest.get("run"), dict):
        raise UsageError(f"--input {path}: {MANIFEST_NAME} is not a relabel run manifest")
    files = [f for f in expand_inputs([path], settings.output)
             if is_own_name(f.path.rsplit("/", 1)[-1], (PART_PATTERN,))]
    labels = labeling_from_record("--input", path, manifest["run"])
    return RunInput(run_name(path), path, TRAINING_ROWS, labels, tuple(files))


def _delta_runs(path: str, settings: DifficultySettings) -> list[RunInput]:
    """Each `run` partition of a Delta table `relabel run --output-format delta` wrote: one run, read with
    the options of the commit that wrote it."""
    storage = delta_table.storage_options(path, dict(settings.storage_options))
    deltalake = _deltalake()
    try:
        version = deltalake.DeltaTable(path, storage_options=storage).version()
    except Exception as error:  # noqa: BLE001 - deltalake's errors have no common type
        raise UsageError(f"--input {path}: not a readable Delta table: {str(error).splitlines()[0]}") from None
    history = delta_table.history(path, storage)
    names = sorted({entry.get("run") for entry in history if entry.get("run")})
    runs = []
    for name in names:
        try:
            found = delta_table.version_rows(path, version, name, storage)
        except UsageError:
            continue  # a run whose partition was emptied since
        listed = {m.path: m for p in found.files for m in filesystem.match(p)}
        files = tuple(_listed(p, listed) for p in found.files)
        labels = labeling_from_record("--input", path, found.record.get("options") or {})
        runs.append(RunInput(name, f"{path}#{name}", TRAINING_ROWS, labels, files))
    if not runs:
        raise UsageError(f"--input {path}: the Delta table holds no run relabel wrote")
    return runs


def _listed(path: str, listed: dict) -> InputFile:
    meta = listed.get(path)
    if meta is None:
        raise UsageError(f"{path}: a file of the Delta table is missing")
    return InputFile(path, "", int(meta.size_in_bytes), float(meta.last_updated_in_seconds))


def packs(runs: list[RunInput]) -> list[tuple[Work, ...]]:
    """The elements of the pipeline: every run's groups (plan), in order, packed into elements of up to
    PACK_BYTES of stored input each (a larger group is an element of its own); within an element, each
    run's groups are one Work. The runner pays per element, and an element reads each next file (the
    next run's first one too) while it labels one; a large run still spreads over several elements."""
    elements: list[tuple[Work, ...]] = []
    packed: list[tuple[RunInput, list]] = []  # (run, its groups in the element being packed)
    size = 0
    for run in runs:
        for group in plan(run):
            group_size = sum(f.size for f in group)
            if packed and size + group_size > PACK_BYTES:
                elements.append(tuple(_work(r, groups) for r, groups in packed))
                packed, size = [], 0
            if packed and packed[-1][0] is run:
                packed[-1][1].append(group)
            else:
                packed.append((run, [group]))
            size += group_size
    if packed:
        elements.append(tuple(_work(r, groups) for r, groups in packed))
    return elements


def _work(run: RunInput, groups: list[list]) -> Work:
    return Work(run.name, run.kind, run.labeling, tuple(f for group in groups for f in group),
                tuple(len(group) for group in groups))


def plan(run: RunInput) -> list[list]:
    """The run's files in groups that share no batch (rollouts); training rows need no batch: a file each."""
    if run.kind == TRAINING_ROWS:
        return [[f] for f in run.files]
    groups, _ = group_by_batch_sharing(list(run.files), max_group_bytes=float("inf"),
                                       batch_from=run.labeling.batch_from, step=run.labeling.step_column())
    return groups


def read_existing(settings: DifficultySettings) -> tuple[dict, list[InputFile]] | None:
    """(the table's record, its files as entries), or None when there is no table yet."""
    if settings.output_format == "delta":
        storage = delta_table.storage_options(settings.output, dict(settings.storage_options))
        deltalake = _deltalake()
        try:
            delta = deltalake.DeltaTable(settings.output, storage_options=storage)
        except deltalake.exceptions.TableNotFoundError:
            return None
        record = next((entry[difficulty_table.RECORD_KEY] for entry in delta.history()
                       if isinstance(entry.get(difficulty_table.RECORD_KEY), dict)), None)
        if record is None:
            raise UsageError(f"--output {settings.output}: a Delta table relabel difficulty did not write; pass "
                             "--overwrite to replace it")
        paths = sorted(delta.file_uris())
        listed = {m.path: m for p in paths for m in filesystem.match(p)}
        return record, [_listed(p, listed) for p in paths]
    record = output_files.read_lineage(settings.output, TABLE_NAME)
    if record is None:
        return None
    if record.get("kind") != "difficulty":
        raise UsageError(f"--output {settings.output}: holds a {TABLE_NAME} relabel difficulty did not write; pass "
                         "--overwrite to replace it")
    path = filesystem.join(settings.output, TABLE_NAME)
    meta = filesystem.match(path)[0]
    return record, [InputFile(path, "", int(meta.size_in_bytes), float(meta.last_updated_in_seconds))]


def read_table(settings: DifficultySettings, existing) -> pa.Table:
    """The table as committed (its files in order)."""
    tables = []
    for entry in existing[1]:
        with filesystem.open_read(entry.path) as handle:
            tables.append(pq.read_table(handle))
    return pa.concat_tables(tables) if tables else difficulty_table.build([], settings.by, settings.ks)


def staging_place(settings: DifficultySettings, record: dict) -> tuple[str, str]:
    """Where the pipeline writes the new table before the commit: a hidden name of the output folder (a
    Delta table's readers skip `_` names too), unique to what it will hold."""
    token = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]
    if settings.output_format == "delta":
        filesystem.mkdirs(settings.output)
    return settings.output, f"_staged-{token}.parquet"


def commit(settings: DifficultySettings, staged: str) -> int:
    """The staged table made the table, in one commit (a Parquet output's: a rename); returns its row count."""
    if settings.output_format != "delta":
        rows = _file_rows(staged)
        output_files.commit_file(staged, settings.output, TABLE_NAME)
        return rows
    with filesystem.open_read(staged) as handle:
        parquet = pq.ParquetFile(io.BytesIO(handle.read()))
    record = json.loads(parquet.schema_arrow.metadata[output_files.LINEAGE_KEY])
    table = parquet.read()
    deltalake = _deltalake()
    from deltalake.transaction import CommitProperties
    deltalake.write_deltalake(settings.output, table.replace_schema_metadata(None), mode="overwrite",
                              schema_mode="overwrite",
                              storage_options=delta_table.storage_options(settings.output,
                                                                          dict(settings.storage_options)),
                              commit_properties=CommitProperties(custom_metadata={difficulty_table.RECORD_KEY: record}))
    filesystem.delete_existing([staged])
    return table.num_rows


def _file_rows(path: str) -> int:
    """A Parquet file's row count, from its footer."""
    with filesystem.open_read(path) as handle:
        return pq.ParquetFile(handle).metadata.num_rows


def write_kept(settings: DifficultySettings, keep, table) -> tuple[int, str]:
    """The rows --keep keeps: their keys and prompts, in key order."""
    mask = keep_lib.evaluate(keep, table)
    names = [c for c in (difficulty_table.KEY, difficulty_table.RUN, difficulty_table.STEP, difficulty_table.PROMPT)
             if c in table.column_names]
    kept = table.filter(mask).select(names).replace_schema_metadata(None)
    target = settings.keep_output or filesystem.join(settings.output, KEPT_NAME)
    directory, name = (target.rsplit("/", 1) if "/" in target else (".", target))
    if "://" not in directory:
        os.makedirs(directory, exist_ok=True)
    output_files.write_parquet_atomically(kept, directory, name,
                                          lineage={"kind": "difficulty-kept", "keep": settings.keep})
    return kept.num_rows, target
