"""`--output-format delta`: a run published as one commit of a Delta table.

A Delta run is a folder run into a folder of the table unique to the commit
it prepares (transforms/lib/output/delta_table.py), then one commit: the
training rows' table first (the point of publication, where a concurrent
backfill of the same run is caught), then the run's dead letters and
filtered rows in their own tables. The commit is made here, in the driver,
after the pipeline finished: a pipeline that fails, is stopped or killed
never reaches it, so the table stays at its last version.
"""
from __future__ import annotations

import argparse
from dataclasses import replace

import apache_beam as beam
import pyarrow as pa

from rollout_relabel.pipeline import output_parquet
from rollout_relabel.pipeline.output_parquet import RunOutcome
from rollout_relabel.pipeline.parse import Parsed
from rollout_relabel.transforms.core.reasons import Reason
from rollout_relabel.transforms.lib.errors import ExitCode, UsageError
from rollout_relabel.transforms.lib.io import filesystem, formats
from rollout_relabel.transforms.lib.io.inputs import expand_inputs
from rollout_relabel.transforms.lib.output import delta_table
from rollout_relabel.transforms.lib.output.output_dir import DEAD_LETTERS_NAME, FILTERED_NAME, refuse_folder_output
from rollout_relabel.transforms.lib.output.part_files import batch_inputs
from rollout_relabel.transforms.lib.rescoring import store
from rollout_relabel.transforms.lib.settings import RunSettings
from rollout_relabel.transforms.lib.worker.faults import crash_point

EXCLUDED_FILES = {"dead": DEAD_LETTERS_NAME, "filtered": FILTERED_NAME}


def run_name(args: argparse.Namespace, settings: RunSettings) -> str:
    """--run-name, else the name of the (first) input folder."""
    if args.run_name:
        return delta_table.check_run_name(args.run_name)
    first = settings.inputs[0].rstrip("/")
    folder = first if formats.detect(first) is None else first.rsplit("/", 1)[0]
    return delta_table.check_run_name(folder.rsplit("/", 1)[-1] or "run")


def run(parsed: Parsed, settings: RunSettings, test_pipeline: beam.Pipeline | None = None) -> RunOutcome:
    """One run into the Delta table --output: stage its part files, then commit them once."""
    table = settings.output
    run = run_name(parsed.args, settings)  # the run partition (this function is the module's run)
    storage = delta_table.storage_options(table, delta_table.storage_flags(parsed.args.storage_options))
    refuse_folder_output(table)
    files = expand_inputs(settings.inputs, table)
    if not files:
        raise UsageError(f"no .pt or .parquet files found under {' '.join(settings.inputs)}")
    inputs = batch_inputs(files)
    snapshot = delta_table.open_snapshot(table, run, storage)
    last = snapshot.last_commit()
    if last is not None and last.get("fingerprint") != settings.fingerprint() and not settings.overwrite:
        raise UsageError(f"{table} holds run {run} made with other options (fingerprint {last.get('fingerprint')} "
                         f"!= {settings.fingerprint()}, version {last.get('version')}); pass --overwrite to replace it")
    # rescoring: reward-failed rows are not final, a plain rerun retries them (and only them), as for a folder
    retry_rewards = settings.rescoring is not None and any(
        k.startswith(Reason.REWARD_FAILED) for k in (last or {}).get("dead_letters", {}))
    if (last is not None and not settings.overwrite and last.get("fingerprint") == settings.fingerprint()
            and last.get("inputs") == inputs and _holds_commit(snapshot, last) and not retry_rewards):
        repaired = _commit_records(table, run, storage, last, last.get("token"))
        return RunOutcome(_exit_code(last["counts"]), table, None, [
            f"already complete: run {run} of {table} (version {last['version']}) matches these inputs and options; "
            "nothing to do" + (f" (records tables brought up to it: {', '.join(repaired)})" if repaired else "")])

    token = delta_table.commit_token(settings.fingerprint(), inputs, snapshot)
    staging = delta_table.staging_folder(table, run, token)
    if settings.rescoring is not None and last is not None and last.get("token") not in (None, token):
        _carry_answers(delta_table.staging_folder(table, run, last["token"]), staging)
    # the staging folder is this commit's alone: a rerun resumes in it, never replaces it
    outcome = output_parquet.run(parsed, replace(settings, output=staging, overwrite=False), test_pipeline,
                                 files)
    if outcome.manifest is None or outcome.exit_code not in (ExitCode.OK, ExitCode.DEAD_LETTERS):
        return replace(outcome, notes=[*outcome.notes, f"nothing committed: {table} stays at version "
                                                       f"{snapshot.version}"])
    manifest = outcome.manifest
    prefix = f"{delta_table.partition_folder(run)}/{token}/"
    parts = sorted({i["output"] for i in manifest["inputs"] if i.get("output")})
    actions, schema = delta_table.add_actions(table, run, [prefix + p for p in parts])
    record = {"fingerprint": settings.fingerprint(), "options": settings.lineage(), "inputs": inputs,
              "token": token, "counts": manifest["counts"], "dead_letters": manifest["dead_letters"]["by_reason"],
              "records": {kind: manifest[key]["file"] is not None for kind, key in (("dead", "dead_letters"),
                                                                                  ("filtered", "filtered"))}}
    records_at = {kind: f"{delta_table.records_table(table, kind)} (run {run})" for kind in EXCLUDED_FILES}
    if snapshot.delta is None and schema is None:
        # a first run with no training row (every row dead): there is nothing to create the table with, but its
        # dead letters are committed all the same, where readers look for them
        committed = _commit_records(table, run, storage, record, token, staging)
        return RunOutcome(_exit_code(manifest["counts"]), table, manifest, [
            f"committed   no training rows: {table} is not created until a run writes some; records in "
            f"{', '.join(committed) or 'none'} (run {run}, token {token})"], records_at)
    crash_point("before-commit", run)
    version = delta_table.commit(snapshot, actions, schema, record)
    record = dict(record, version=version)
    _commit_records(table, run, storage, record, token, staging)
    if "rollout_correction" in manifest:
        records_at["correction"] = f"{_commit_correction(table, run, storage, record, token, manifest)} (run {run})"
    return RunOutcome(outcome.exit_code, table, manifest, [
        f"committed   version {version} of {table} (run {run}, {len(actions)} part files, token {token})"],
        records_at)


def _holds_commit(snapshot: delta_table.Snapshot, last: dict) -> bool:
    """Whether the run's partition is what that commit left (no one replaced or deleted it since)."""
    prefix = f"{delta_table.partition_folder(snapshot.run)}/{last.get('token')}/"
    if not snapshot.files:
        return not last["counts"]["rows_out"]
    return all(f.startswith(prefix) for f in snapshot.files)


def _commit_records(table: str, run: str, storage, record: dict, token: str, staging: str | None = None) -> list[str]:
    """Bring each records table's partition of the run to this commit's records (dead letters, filtered
    rows): a table whose last commit of the run carries another token is replaced, one commit each, the
    records copied from the staging folder next to the training rows. Returns the tables committed."""
    staging = staging or delta_table.staging_folder(table, run, token)
    committed = []
    for kind, name in EXCLUDED_FILES.items():
        target = delta_table.records_table(table, kind)
        snapshot = delta_table.open_snapshot(target, run, storage)
        last = snapshot.last_commit()
        has_records = bool(record.get("records", {}).get(kind))
        if (last or {}).get("token") == token:
            continue
        source = filesystem.join(staging, name)
        relative = []
        if has_records:
            if not filesystem.exists(source):
                continue  # its staging folder is gone (vacuumed): the next backfill of the run brings it
            # in the records table the file is named by its commit (the folder's `_` layout is not needed there)
            relative = [f"{delta_table.partition_folder(run)}/{token}-{name.lstrip('_')}"]
            _copy(source, filesystem.join(target, relative[0]))
        actions, schema = delta_table.add_actions(target, run, relative)
        # a run without records still commits (an empty partition): the table exists for every reader
        delta_table.commit(snapshot, actions, schema or delta_table.RECORDS_SCHEMA, dict(record, kind=kind))
        committed.append(target)
    return committed


def _commit_correction(table: str, run: str, storage, record: dict, token: str, manifest: dict) -> str:
    """The run's per-batch rollout-correction metrics into their table's partition of the run (one commit,
    unless this commit's are there already), so that a run's drift over its steps can be queried. Returns the
    table."""
    import pyarrow.parquet as pq

    from rollout_relabel.transforms.lib.output.output_files import write_bytes_atomically

    target = delta_table.correction_table(table)
    snapshot = delta_table.open_snapshot(target, run, storage)
    if (snapshot.last_commit() or {}).get("token") == token:
        return target
    relative = f"{delta_table.partition_folder(run)}/{token}-rollout_correction.parquet"
    sink = pa.BufferOutputStream()
    pq.write_table(delta_table.correction_rows(manifest["rollout_correction"]), sink)
    folder, name = filesystem.join(target, relative).rsplit("/", 1)
    filesystem.mkdirs(folder)
    write_bytes_atomically(sink.getvalue().to_pybytes(), folder, name)
    actions, schema = delta_table.add_actions(target, run, [relative])
    schema = schema or delta_table.CORRECTION_SCHEMA.append(pa.field(delta_table.RUN_COLUMN, pa.string()))
    delta_table.commit(snapshot, actions, schema, dict(record, kind="rollout_correction"))
    return target


def _carry_answers(previous: str, staging: str) -> None:
    """The verifier's answers kept by the run's previous commit (its staging folder's `_rewards/`, rescoring.md)
    copied into this commit's folder, so a backfill of the run (other options, or a retry of failed rows)
    sends no call it has an answer for, as a folder output's `_rewards/` does. The per-file rows are not
    carried: they are this commit's to write."""
    source = filesystem.join(previous, store.FOLDER)
    for found in filesystem.match_in(source, "*/known-*.parquet"):
        relative = found.path[len(source):].lstrip("/")
        target = filesystem.join(staging, store.FOLDER, relative)
        if not filesystem.exists(target):
            _copy(found.path, target)


def _copy(source: str, destination: str) -> None:
    from rollout_relabel.transforms.lib.output.output_files import write_bytes_atomically

    with filesystem.open_read(source) as handle:
        data = handle.read()
    folder, name = destination.rsplit("/", 1)
    filesystem.mkdirs(folder)
    write_bytes_atomically(data, folder, name)


def _exit_code(counts: dict) -> ExitCode:
    return ExitCode.DEAD_LETTERS if counts.get("rows_dead") or counts.get("files_unreadable") else ExitCode.OK


def backfill_output(output: str, run: str) -> str:
    """Every run of a backfill goes to the one table --output (its own run partition)."""
    return output


def published(args: argparse.Namespace, run: str) -> tuple[int | None, dict]:
    """The table's version holding the run, and the counts its commit recorded."""
    found = delta_table.open_snapshot(args.output, run, delta_table.storage_options(
        args.output, delta_table.storage_flags(args.storage_options))).last_commit()
    return (found["version"], found.get("counts", {})) if found else (None, {})
