"""Delta Lake output: a run's part files published by one Delta commit (no Beam here).

A `relabel run --output-format delta` writes its part files as a folder run
does, into a folder of the table that is unique to the commit it prepares
(`run=<name>/<token>/`), then publishes them with one transaction that adds
them and removes the files the run's partition held. Until that commit a
reader of the table sees the previous version; after it, the new one: never
a partial run. The commit's info carries the options record and fingerprint,
so `DeltaTable.history()` says which semantics made each version.

The token names the commit being prepared: it is derived from the options,
the inputs and what the run's partition holds now, so a rerun of a killed
backfill finds the part files it already wrote (and resumes), while the next
backfill of the run, whose partition then holds this commit's files, gets
another token and never writes over a file an earlier version references.

The transaction API used is deltalake's `DeltaTable.create_write_transaction`
(overwrite with partition filters: the partition's current files are removed
in the same commit) and `create_table_with_add_actions` for a table's first
commit, as in delta-io/delta-rs python/deltalake/transaction.py and table.py
(commit 6f52fa6e416d8f7a3540e1e85475601c60d9e3ce).
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from rollout_relabel import schemas
from rollout_relabel.transforms.lib.errors import CommitConflict, UsageError
from rollout_relabel.transforms.lib.io import filesystem

if TYPE_CHECKING:  # deltalake is imported when a Delta output is used, not with this module
    from deltalake import DeltaTable

RUN_COLUMN = schemas.RUN_PARTITION.name
METADATA_KEY = "rollout_relabel"  # our record in each commit's info
RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# the dead letters and filtered rows of every run: tables of their own, beside the training rows' table
RECORD_TABLE_SUFFIX = {"dead": "_dead_letters", "filtered": "_filtered"}
OBJECT_STORE_SCHEMES = ("s3://", "s3a://")
# the records tables' schema: created with it even by a run without records, so that readers always find them
RECORDS_SCHEMA = schemas.DEAD_LETTERS.append(pa.field(RUN_COLUMN, pa.string()))


def _deltalake():
    """deltalake, or a UsageError naming the extra that installs it."""
    try:
        import deltalake
    except ImportError:
        raise UsageError("--output-format delta needs deltalake: pip install -c constraints.txt "
                         "'rollout-relabel[delta]'") from None
    return deltalake


def check_run_name(name: str) -> str:
    """A run name is a partition value and a folder name: letters, digits, `.`, `_`, `-`."""
    if not RUN_NAME.fullmatch(name or ""):
        raise UsageError(f"--run-name {name!r}: use letters, digits, '.', '_' and '-' (starting with a letter or "
                         "digit)")
    return name


def storage_flags(flags: list[str] | None) -> dict[str, str]:
    """--storage-option KEY=VALUE flags as a dict."""
    options = {}
    for flag in flags or []:
        key, sep, value = flag.partition("=")
        if not sep or not key:
            raise UsageError(f"--storage-option {flag!r}: expected KEY=VALUE")
        options[key] = value
    return options


def storage_options(table: str, given: dict[str, str]) -> dict[str, str] | None:
    """deltalake's storage options for `table`. On S3 two writers must not both create one commit file:
    unless a locking provider is named, commits use conditional writes (`conditional_put=etag`: S3, MinIO
    and moto refuse a second create of the same log entry), so no lock table is needed."""
    options = dict(given)
    if table.startswith(OBJECT_STORE_SCHEMES) and "AWS_S3_LOCKING_PROVIDER" not in {k.upper() for k in options}:
        options.setdefault("conditional_put", "etag")
    return options or None


# rollout correction's per-batch metrics (docs/off-policy.md): a table of its own, long format (one row per batch
# and metric) so that every preset's metrics share one schema
CORRECTION_TABLE_SUFFIX = "_rollout_correction"
CORRECTION_SCHEMA = pa.schema([
    pa.field("batch", pa.string(), nullable=False), pa.field("rows", pa.int64(), nullable=False),
    pa.field("trainable_tokens", pa.int64(), nullable=False), pa.field("rows_rejected", pa.int64(), nullable=False),
    pa.field("tokens_rejected", pa.int64(), nullable=False), pa.field("metric", pa.string()),
    pa.field("value", pa.float64())])


def correction_table(table: str) -> str:
    """The table holding the per-batch rollout-correction metrics of the training rows' table `table`."""
    return table.rstrip("/") + CORRECTION_TABLE_SUFFIX


def correction_rows(section: dict) -> pa.Table:
    """A manifest's `rollout_correction` as CORRECTION_SCHEMA rows: one per batch and metric, sorted; a batch
    without metrics (no trainable token) one row with a null metric."""
    rows = []
    for batch, entry in sorted(section["batches"].items()):
        counts = {k: entry[k] for k in ("rows", "trainable_tokens", "rows_rejected", "tokens_rejected")}
        metrics = entry["metrics"]
        if metrics is None:
            rows.append(dict(batch=batch, **counts, metric=None, value=None))
        rows += [dict(batch=batch, **counts, metric=name, value=value)
                 for name, value in sorted((metrics or {}).items())]
    return pa.Table.from_pylist(rows, schema=CORRECTION_SCHEMA)


def records_table(table: str, kind: str) -> str:
    """The table holding `kind` records ("dead", "filtered") of the training rows' table `table`."""
    return table.rstrip("/") + RECORD_TABLE_SUFFIX[kind]


def partition_folder(run: str) -> str:
    return f"{RUN_COLUMN}={run}"


@dataclass
class Snapshot:
    """One table as a backfill of `run` found it: the version it commits against (None: no table yet)."""
    table: str
    run: str
    storage: dict | None
    delta: DeltaTable | None  # loaded at that version
    version: int | None
    files: tuple[str, ...]  # what the run's partition holds (paths relative to the table)

    def last_commit(self) -> dict | None:
        """Our record in the newest commit that replaced this run's partition, or None."""
        if self.delta is None:
            return None
        for entry in self.delta.history():
            record = entry.get(METADATA_KEY)
            if isinstance(record, dict) and record.get("run") == self.run:
                return dict(record, version=entry.get("version"))
        return None


def open_snapshot(table: str, run: str, storage: dict | None) -> Snapshot:
    """Load the table's latest version (or find there is none) and list the run's partition."""
    deltalake = _deltalake()
    try:
        delta = deltalake.DeltaTable(table, storage_options=storage)
    except deltalake.exceptions.TableNotFoundError:
        return Snapshot(table, run, storage, None, None, ())
    return Snapshot(table, run, storage, delta, delta.version(), _partition_files(delta, run))


def _partition_files(delta, run: str) -> tuple[str, ...]:
    files = pa.table(delta.get_add_actions(flatten=True))
    if not files.num_rows:
        return ()
    paths, runs = files.column("path").to_pylist(), files.column(f"partition.{RUN_COLUMN}").to_pylist()
    return tuple(sorted(p for p, r in zip(paths, runs) if r == run))


def commit_token(fingerprint: str, inputs: str, snapshot: Snapshot) -> str:
    """Names the commit being prepared (module docstring). An empty partition has no files to tell two
    commits apart by, so the table's version stands in for them."""
    state = list(snapshot.files) if snapshot.files else [f"empty at version {snapshot.version}"]
    text = json.dumps([fingerprint, inputs, snapshot.run, state])
    return "c-" + hashlib.sha256(text.encode()).hexdigest()[:16]


def staging_folder(table: str, run: str, token: str) -> str:
    """Where a commit's part files are written: inside the table, unique to the commit."""
    return filesystem.join(table, partition_folder(run), token)


def parquet_rows_and_schema(path: str) -> tuple[int, pa.Schema]:
    with filesystem.open_read(path) as handle:
        metadata = pq.ParquetFile(handle).metadata
        return metadata.num_rows, metadata.schema.to_arrow_schema()


def add_actions(table: str, run: str, relative: list[str]) -> tuple[list, pa.Schema | None]:
    """deltalake AddActions for the files (paths relative to the table) that hold rows, and the schema they
    share (every file's columns, without metadata, plus the run column), or None when none holds a row.

    A part file of no rows (an input that was dead-lettered whole) adds nothing to read, and its columns
    would not be the run's: it is left out."""
    from deltalake.transaction import AddAction

    actions, schemas = [], []
    for path in relative:
        full = filesystem.join(table, path)
        found = [filesystem.stat(full)]
        if found[0] is None:
            raise FileNotFoundError(f"{full}: a part file to commit is missing")
        rows, file_schema = parquet_rows_and_schema(full)
        if not rows:
            continue
        schemas.append(file_schema.remove_metadata())
        actions.append(AddAction(path, int(found[0].size_in_bytes), {RUN_COLUMN: run},
                                 int(found[0].last_updated_in_seconds * 1000), True,
                                 json.dumps({"numRecords": rows})))
    if not schemas:
        return actions, None
    return actions, pa.unify_schemas(schemas).append(pa.field(RUN_COLUMN, pa.string()))


def table_schema(delta, ours: pa.Schema | None, run: str = ""):
    """The schema to commit with: the table's own when it has every column of ours (the commit changes no
    metadata, so it conflicts with no concurrent commit of another run), else the table's widened by ours
    (a metadata change: a concurrent commit retries).

    The one rule for schema changes between runs (docs/backfills.md, "Schema changes between runs"): a column
    new to the table is added (older rows read it as null); a column the table has keeps its type, so a run
    whose column has another type (text keys where they were int64, a struct reward where it was a number)
    is refused here, before its commit: files of another type under one column would make the version
    unreadable."""
    deltalake = _deltalake()
    current = delta.schema()
    if ours is None:
        return current
    refuse_type_changes(delta, current, deltalake.Schema.from_arrow(ours), run)
    have = {field.name for field in current.fields}
    if all(name in have for name in ours.names):
        return current
    widened = pa.unify_schemas([pa.schema(current.to_arrow()), ours], promote_options="permissive")
    return deltalake.Schema.from_arrow(widened)


def _type_text(kind) -> str:
    """A Delta type as text without nullability (a struct field or list item nullable in one run and not in
    another is the same column)."""
    return re.sub(r", (nullable|contains_null|value_contains_null)=(True|False)", "", str(kind))


def refuse_type_changes(delta, current, ours, run: str) -> None:
    """UsageError naming every column of ours whose type is not the table's (see table_schema)."""
    theirs = {field.name: field.type for field in current.fields}
    changed = [f"`{field.name}` is {_type_text(field.type)} where the table's is {_type_text(theirs[field.name])}"
               for field in ours.fields if field.name in theirs
               and _type_text(field.type) != _type_text(theirs[field.name])]
    if changed:
        raise UsageError(f"{delta.table_uri}: run {run}'s {'; '.join(changed)}: a column keeps the type the table "
                         "gave it (docs/backfills.md, \"Schema changes between runs\"); nothing was committed, the "
                         f"table stays at version {delta.version()}: write the run into another table, or make the "
                         "column's type the table's")


def commit(snapshot: Snapshot, actions: list, schema: pa.Schema | None, record: dict) -> int:
    """Replace the run's partition with `actions` in one commit, against the version the snapshot loaded:
    a concurrent commit that replaced the same run first makes this one fail (CommitConflict, nothing
    committed); one that touched other runs only does not. Returns the version committed."""
    deltalake = _deltalake()
    from deltalake.transaction import create_table_with_add_actions

    delta = snapshot.delta
    properties = _properties(snapshot, record)
    if delta is None:
        if schema is None:
            raise UsageError(f"{snapshot.table}: no table yet and nothing to create it with")
        try:
            create_table_with_add_actions(snapshot.table, deltalake.Schema.from_arrow(schema), actions, mode="error",
                                          partition_by=[RUN_COLUMN], storage_options=snapshot.storage,
                                          commit_properties=properties)
            return deltalake.DeltaTable(snapshot.table, storage_options=snapshot.storage).version()
        except deltalake.exceptions.DeltaError:
            # another backfill created the table meanwhile: commit into it, unless it holds this run now
            snapshot = open_snapshot(snapshot.table, snapshot.run, snapshot.storage)
            if snapshot.delta is None:
                raise
            if snapshot.files:
                raise _conflict(snapshot) from None
            delta = snapshot.delta
            properties = _properties(snapshot, record)
    schema = table_schema(delta, schema, snapshot.run)
    try:
        delta.create_write_transaction(actions, "overwrite", schema, partition_by=[RUN_COLUMN],
                                       partition_filters=[(RUN_COLUMN, "=", snapshot.run)],
                                       commit_properties=properties)
    except deltalake.exceptions.CommitFailedError as error:
        raise _conflict(snapshot, error) from None
    return _version_of(snapshot, record)


def _properties(snapshot: Snapshot, record: dict):
    """The commit's info (our record), and the run's application transaction: its version one past the one
    this backfill read. Overwriting an empty partition removes nothing, so two backfills of a new run
    would not conflict by their files; the same application id in both commits makes Delta's conflict
    check refuse the second (it does not for commits of other runs, whose ids differ)."""
    from deltalake.transaction import CommitProperties, Transaction

    app_id = f"{METADATA_KEY}/{partition_folder(snapshot.run)}"
    read = snapshot.delta.transaction_version(app_id) if snapshot.delta is not None else None
    return CommitProperties(custom_metadata={METADATA_KEY: dict(record, run=snapshot.run)},
                            app_transactions=[Transaction(app_id, (read or 0) + 1)])


def _version_of(snapshot: Snapshot, record: dict) -> int:
    """The version our commit became (others may have committed since)."""
    latest = open_snapshot(snapshot.table, snapshot.run, snapshot.storage)
    found = latest.last_commit()
    if found is None or found.get("token") != record.get("token"):
        raise CommitConflict(f"{snapshot.table}: the commit of run {snapshot.run} is not in the table's history")
    return int(found["version"])


def _conflict(snapshot: Snapshot, error: Exception | None = None) -> CommitConflict:
    latest = open_snapshot(snapshot.table, snapshot.run, snapshot.storage)
    winner = latest.last_commit() or {}
    said = f" ({str(error).splitlines()[0]})" if error else ""
    if winner and (snapshot.version is None or winner["version"] > snapshot.version):
        what = (f"another backfill of run {snapshot.run} committed first (version {winner['version']}, "
                f"fingerprint {winner.get('fingerprint')})")
    else:  # another run's commit that changed the table's metadata (a wider schema)
        what = f"a concurrent commit changed the table (now version {latest.version})"
    return CommitConflict(f"{snapshot.table}: {what} after this one read version {snapshot.version}{said}; "
                          "nothing of this backfill was committed: rerun it")


def history(table: str, storage: dict | None = None) -> list[dict]:
    """Our record of each commit, newest first: version, run, fingerprint, options, counts."""
    delta = _deltalake().DeltaTable(table, storage_options=storage)
    return [dict(entry[METADATA_KEY], version=entry.get("version")) for entry in delta.history()
            if isinstance(entry.get(METADATA_KEY), dict)]


@dataclass(frozen=True)
class VersionRows:
    """One run's rows in one version of a table: the part files holding them, and the record of the commit
    that made them (its options say which semantics labelled them)."""
    files: tuple[str, ...]
    record: dict


def version_rows(table: str, version: int, run: str | None, storage: dict | None = None) -> VersionRows:
    """The files and the making commit of `run` (None: the version's only run) in `version` of `table`."""
    deltalake = _deltalake()
    try:
        delta = deltalake.DeltaTable(table, version=version, storage_options=storage)
    except deltalake.exceptions.TableNotFoundError:
        raise UsageError(f"{table}: not a Delta table") from None
    except Exception as error:  # noqa: BLE001 - deltalake's errors for a missing version have no common type
        raise UsageError(f"{table}@{version}: cannot be read: {str(error).splitlines()[0]}") from None
    files = pa.table(delta.get_add_actions(flatten=True))
    runs = sorted(set(files.column(f"partition.{RUN_COLUMN}").to_pylist())) if files.num_rows else []
    if run is None:
        if len(runs) != 1:
            raise UsageError(f"{table}@{version} holds runs {', '.join(runs) or '(none)'}: name one as "
                             f"delta:{table}@{version}#RUN")
        run = runs[0]
    if run not in runs:
        raise UsageError(f"{table}@{version} holds no run {run!r} (it holds {', '.join(runs) or 'none'})")
    paths = sorted(p for p, r in zip(files.column("path").to_pylist(),
                                     files.column(f"partition.{RUN_COLUMN}").to_pylist()) if r == run)
    # The history of the latest table: deltalake 1.6 numbers the history of a table loaded at an older version
    # from that version down, so its newest commits would pass for version V's (measured here: loaded at
    # version 1 of three, the third commit is labelled 1).
    latest = deltalake.DeltaTable(table, storage_options=storage)
    for entry in latest.history():
        record = entry.get(METADATA_KEY)
        if isinstance(record, dict) and record.get("run") == run and entry.get("version", version + 1) <= version:
            return VersionRows(tuple(filesystem.join(table, p) for p in paths), dict(record, version=entry["version"]))
    raise UsageError(f"{table}@{version}: run {run} was not written by relabel (no options record in its history)")
