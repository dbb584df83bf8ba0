"""run_watch(argv): `relabel watch`: relabel rollout files as they land, until told to stop.

The pipeline is WatchFiles -> RelabelLandedFiles; everything it writes is
committed file by file (temp + rename), so stopping at any point loses at
most the group in progress, which the next watch redoes.
"""
from __future__ import annotations

import os
import signal
import threading

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from pipeline import watch_records
from pipeline.inputs import expand_inputs
from pipeline.options import UsageError, watch_settings_from_options
from pipeline.runner import RunOutcome, parse, read_manifest, remove_run_outputs
from transforms import sinks
from transforms.relabel_landed import RelabelLandedFiles
from transforms.watch_files import WatchFiles


def build_watch(p: beam.Pipeline, settings, watch, lineage: dict):
    releases = p | "WatchFiles" >> WatchFiles(
        settings.inputs, settings.output, settings.fingerprint(), watch.poll_interval, watch.stop_after_idle,
        watch.stop_after_files, watch.require_marker)
    return releases | "RelabelLandedFiles" >> RelabelLandedFiles(
        settings.core, settings.reward_key, settings.drop_uniform_groups, settings.device, settings.output, lineage,
        settings.fingerprint())


def run_watch(argv: list[str], test_pipeline: beam.Pipeline | None = None) -> RunOutcome:
    options, settings = parse(argv, command="watch")
    watch = watch_settings_from_options(options, settings)
    output = settings.output
    lineage = dict(settings.semantics_record(), fingerprint=settings.fingerprint())
    _prepare_output(output, settings)

    pipeline = test_pipeline if test_pipeline is not None else beam.Pipeline(options=options)
    build_watch(pipeline, settings, watch, lineage)
    notes = []
    with StopOnSignal(output) as stop:
        pipeline.run().wait_until_finish()
    sinks.delete_existing([watch_records.stop_path(output)])
    if stop.requested:
        notes.append("stopped: interrupted; files not finished are relabelled by the next watch")
    manifest = watch_records.write_watch_manifest(output, lineage, settings.fingerprint(), "stopped",
                                                  _not_done(settings, output))
    waiting = manifest["watch"]["not_done"]
    notes.append(f"watch       {manifest['watch']['files_done']} files done"
                 + (f"; {len(waiting)} landed or landing but not relabelled yet (step not closed, still being "
                    f"written, or left at the stop): {', '.join(waiting)}" if waiting else ""))
    return RunOutcome(_exit_code(manifest), output, manifest, notes)


def _exit_code(manifest):
    from pipeline import manifest as manifest_lib
    return manifest_lib.exit_code(manifest)


def _prepare_output(output: str, settings) -> None:
    """Continue a watch made with the same options; refuse other options unless --overwrite."""
    previous = read_manifest(output)
    if previous is not None and previous.get("fingerprint") != settings.fingerprint():
        if not settings.overwrite:
            raise UsageError(f"{output} holds output made with other options (fingerprint "
                             f"{previous.get('fingerprint')} != {settings.fingerprint()}); pass --overwrite to "
                             "replace it")
        remove_run_outputs(output, [i.get("output") for i in previous["inputs"]])
        stale = [FileSystems.join(output, d) for d in (watch_records.RECORDS_DIR, watch_records.DEAD_LETTERS_DIR,
                                                       watch_records.FILTERED_DIR)]
        sinks.delete_existing(stale)
    sinks.delete_existing([watch_records.stop_path(output)])
    if not FileSystems.exists(output):
        FileSystems.mkdirs(output)


def _not_done(settings, output) -> list[str]:
    try:
        files = expand_inputs(settings.inputs, output)
    except UsageError:
        return []
    fingerprint = settings.fingerprint()
    return [f.path for f in files
            if not watch_records.is_done(watch_records.read_record(output, f.output), fingerprint, f.record())]


class StopOnSignal:
    """First Ctrl-C (or SIGTERM): ask the watch to stop between groups, through a file in the output
    directory that the poller and the relabeller check (workers in other processes see it too).
    A second Ctrl-C interrupts at once."""

    def __init__(self, output: str):
        self._output = output
        self._previous = {}
        self.requested = False

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():  # only there can Python take signals
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        os.write(2, b"relabel watch: stopping after the file in progress (Ctrl-C again to interrupt now)\n")
        sinks.write_bytes_atomically(b"", watch_records.records_dir(self._output), watch_records.STOP_NAME)

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False
