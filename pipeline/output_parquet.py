"""`--output-format parquet`, the folder run: inputs -> output folder checks -> pipeline -> manifest -> outcome.

Every other output format is built on it (a Delta run is a folder run into its commit's staging folder).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import apache_beam as beam
from apache_beam.pipeline import PipelineVisitor

from rollout_relabel.pipeline import progress, worker_output
from rollout_relabel.pipeline.beam_internals import resource_hint_names
from rollout_relabel.pipeline.graph import build
from rollout_relabel.pipeline.local_threads import (
    available_memory,
    local_thread_count,
    parallel_decode,
    pt_processes,
    use_local_threads,
)
from rollout_relabel.pipeline.parse import Parsed
from rollout_relabel.pipeline.runner_checks import RunnerCheck, check_runner
from rollout_relabel.transforms.core.estimators import Estimator
from rollout_relabel.transforms.core.reasons import Reason
from rollout_relabel.transforms.lib.errors import ExitCode, UsageError
from rollout_relabel.transforms.lib.io import filesystem, formats
from rollout_relabel.transforms.lib.io.inputs import expand_inputs
from rollout_relabel.transforms.lib.io.plan import group_by_batch_sharing, read_footers
from rollout_relabel.transforms.lib.output import lease, output_files
from rollout_relabel.transforms.lib.output import manifest as manifest_lib
from rollout_relabel.transforms.lib.output.output_dir import (
    is_legacy_layout,
    make_writable,
    manifest_or_none,
    parts_intact,
    read_manifest,
    read_stop,
    refuse_delta_table,
    refuse_other_options,
    remove_run_outputs,
)
from rollout_relabel.transforms.lib.rescoring import store as rewards_store
from rollout_relabel.transforms.lib.settings import RunSettings
from rollout_relabel.transforms.lib.worker import processes


@dataclass
class RunOutcome:
    exit_code: ExitCode
    output: str
    manifest: dict | None = None
    notes: list[str] = field(default_factory=list)
    # where the dead letters ("dead") and filtered rows ("filtered") went, when not a file of `output` (a
    # Delta run's records tables)
    records_at: dict[str, str] = field(default_factory=dict)

    def summary(self) -> str:
        lines = list(self.notes)
        if self.manifest:
            c = self.manifest["counts"]
            run = self.manifest["run"]
            lines += [
                f"semantics   {run['semantics']}, estimator {run['estimator']}{passed_through(run)}"
                f", std {'on' if run['std_normalization'] else 'off'}; {contract_version(run)}",
                f"files       {c['files']} read ({c['files_unreadable']} unreadable)",
                f"rows        {c['rows_in']} in = {c['rows_out']} written + {c['rows_dead']} dead + "
                f"{c['rows_filtered']} filtered",
                f"batches     {c['batches']}",
                f"groups      {c['groups']} ({c['uniform_groups']} uniform: all rewards equal)",
                f"rollouts    {c['rollouts']}",
            ]
            dead = self.manifest["dead_letters"]
            if dead["by_reason"]:
                lines.append("dead letters " + ", ".join(f"{k}: {v}" for k, v in dead["by_reason"].items())
                             + f"  -> {self.records_at.get('dead') or filesystem.join(self.output, dead['file'])}")
            else:
                lines.append("dead letters none")
            correction = self.manifest.get("rollout_correction")
            if correction is not None:
                batches = correction["batches"].values()
                lines.append(f"rollout corr  {correction['config']['preset'] or 'custom'}: "
                             f"{sum(b['rows_rejected'] for b in batches)} rows / "
                             f"{sum(b['tokens_rejected'] for b in batches)} tokens rejected"
                             + (f"  -> {self.records_at['correction']}" if "correction" in self.records_at else ""))
            filtered = self.manifest.get("filtered") or {}
            if filtered.get("by_reason"):
                where = self.records_at.get("filtered") or filesystem.join(self.output, filtered["file"])
                lines.append("filtered    " + ", ".join(f"{k}: {v}" for k, v in filtered["by_reason"].items())
                             + f"  -> {where}")
            lines.append(f"output      {self.output}")
        return "\n".join(lines)


def passed_through(run: dict) -> str:
    """For an estimator that passes the reward through: which column each row's advantage is (a framework's
    own advantage, under `--format skyrl`), said as such."""
    if not Estimator(run["estimator"]).facts.passes_through:
        return ""
    source = next((c.split("=", 1)[1] for c in run.get("columns") or () if c.startswith("reward=")),
                  run.get("reward_key") or "reward")
    return f" (each row's advantage is its {source}, passed through)"


def contract_version(run: dict) -> str:
    """What the run record's `semantics_version` is: the contract version its rows follow (docs/semantics.md:
    each semantics is at version 1, an option of a later contract version raises it), said as such."""
    return f"contract version {run.get('semantics_version')}"


def run(parsed: Parsed, settings: RunSettings, test_pipeline: beam.Pipeline | None = None,
        files=None) -> RunOutcome:
    """The folder run: settings.output is the folder the part files and the manifest go to (files: the
    inputs when the caller listed them already)."""
    options = parsed.options
    runner_check = check_runner(options, settings)
    files = files if files is not None else expand_inputs(settings.inputs, settings.output)
    if not files:
        raise UsageError(f"no rollout files ({', '.join(formats.suffixes())}) found under {' '.join(settings.inputs)}")
    output = settings.output
    refuse_delta_table(output)
    if settings.dry_run:
        return _relabel(parsed, settings, files, runner_check, test_pipeline)
    make_writable(output)
    with lease.holding(output, "run"):
        return _relabel(parsed, settings, files, runner_check, test_pipeline)


def _relabel(parsed: Parsed, settings: RunSettings, files, runner_check: RunnerCheck,
             test_pipeline: beam.Pipeline | None) -> RunOutcome:
    """The run itself, once the output is ours (or nothing is written: a dry run)."""
    options, output = parsed.options, settings.output

    previous = manifest_or_none(output, settings.overwrite)
    if previous is not None:
        same_inputs = [(i["path"], i["size"], i["mtime"]) for i in previous["inputs"]] == [
            (f.path, f.size, f.mtime) for f in files]
        same_options = previous.get("fingerprint") == settings.fingerprint()
        # rescoring: reward-failed rows are not final, a plain rerun retries them (and only them)
        retry_rewards = settings.rescoring is not None and any(
            k.startswith(Reason.REWARD_FAILED) for k in previous["dead_letters"]["by_reason"])
        # an output of the layout before `_`-names is resumed: its records are rewritten under today's names
        if same_options and same_inputs and not settings.overwrite and parts_intact(output, previous) \
                and not retry_rewards and not is_legacy_layout(output, previous):
            return RunOutcome(ExitCode.OK, output, previous,
                              ["already complete: the output matches these inputs and options; nothing to do"])
        if not settings.overwrite:
            refuse_other_options(output, "a run", previous.get("fingerprint"), settings.fingerprint())
        wanted = {f.output for f in files}
        stale = [i.get("output") for i in previous["inputs"]
                 if settings.overwrite or i.get("output") not in wanted]
        if not settings.dry_run:
            remove_run_outputs(output, stale)
    elif not settings.dry_run:
        _check_partial_output(output, files, settings)

    if settings.rescoring is not None and not settings.dry_run:  # the kept rewards: damaged is a usage error
        rewards_store.check(output, settings.rescoring.identity, settings.overwrite)
    labeling = settings.labeling
    footers = read_footers(files, step=labeling.step_column(), max_bytes=settings.max_file_bytes)
    one_pass, shared = groups = group_by_batch_sharing(files, footers=footers, batch_from=labeling.batch_from)
    if settings.local_threads:
        group_bytes = [sum(footers[f.path].decoded_bytes for f in group) for group in one_pass]
        threads = local_thread_count(settings.local_threads, group_bytes, available_memory(), shuffled=bool(shared))
        use_local_threads(options, threads)
        settings = replace(settings, parallel_decode=parallel_decode(threads),
                           pt_processes=pt_processes(threads, files))
    if settings.dry_run:
        return RunOutcome(ExitCode.OK, output, None, [plan(parsed, settings, files, runner_check, groups)])

    pipeline = test_pipeline if test_pipeline is not None else beam.Pipeline(options=options)
    if settings.pt_processes:
        processes.warm(settings.pt_processes)  # its processes start while Beam builds and starts the pipeline
    build(pipeline, settings, files, groups)
    try:
        with progress.showing(progress.part_files(output, [f.output for f in files]), len(files), "relabel run",
                              settings.progress), worker_output.logged():
            pipeline.run().wait_until_finish()
    except Exception:
        stopped = read_stop(output)  # a worker stopped the run on purpose: its type, not its text
        if stopped is None:
            raise
        remove_run_outputs(output, [f.output for f in files] if stopped.discard_outputs else [])
        return RunOutcome(stopped.exit_code, output, None, [f"relabel: stopped: {stopped}"])
    manifest = read_manifest(output)
    if manifest is None:
        return RunOutcome(ExitCode.INTERNAL, output, None, ["relabel: the pipeline finished but wrote no manifest"])
    return RunOutcome(manifest_lib.exit_code(manifest), output, manifest)


def backfill_output(output: str, run: str) -> str:
    """A backfill gives each run its own folder under --output."""
    return filesystem.join(output, run)


def published(args, run: str) -> tuple[int | None, dict]:
    """A folder has no versions: the run's manifest holds its counts."""
    return None, {}


def _check_partial_output(output, files, settings):
    """An interrupted run resumes; one made with other options must not be mixed with this one."""
    for f in files:
        lineage = output_files.read_lineage(output, f.output)
        if lineage is not None and lineage.get("fingerprint") != settings.fingerprint():
            if not settings.overwrite:
                refuse_other_options(output, f.output, lineage.get("fingerprint"), settings.fingerprint())
            remove_run_outputs(output, [g.output for g in files])
            return
    remove_run_outputs(output, [])


def plan(parsed: Parsed, settings, files, runner_check: RunnerCheck, groups) -> str:
    """Build the graph with the run's options, prove it serializes for workers, and describe it."""
    pipeline = beam.Pipeline(runner="FnApiRunner", options=parsed.options)
    build(pipeline, settings, files, groups)
    pipeline.to_runner_api()  # pickles every DoFn, as submitting to a remote runner would
    if runner_check.family == "dask":  # the Dask runner translates the graph itself: prove it can
        from rollout_relabel.pipeline.dask_runner import bag_options, translate

        dask_pipeline = beam.Pipeline(runner="FnApiRunner", options=parsed.options)
        build(dask_pipeline, settings, files, groups)
        try:
            translate(dask_pipeline, bag_options(parsed.options))
        except NotImplementedError as error:
            raise UsageError(f"--runner DaskRunner: {error}") from None
    lines = [f"dry run: runner {runner_check.runner} ({runner_check.family}), {len(files)} input files, "
             f"output {settings.output}, fingerprint {settings.fingerprint()}",
             *runner_check.describe(), *runner_options(parsed), "stages:"]
    names = resource_hint_names()

    class Describe(PipelineVisitor):
        def enter_composite_transform(self, node):
            if node.full_label and node.full_label.count("/") == 0:
                hints = node.transform.get_resource_hints() if node.transform else {}
                text = " ".join(f"{names.get(urn, urn)}={value.decode()}" for urn, value in sorted(hints.items()))
                lines.append(f"  {node.full_label}" + (f"  [{text}]" if text else ""))

    pipeline.visit(Describe())
    lines.append("nothing was submitted")
    return "\n".join(lines)


def runner_options(parsed: Parsed) -> list[str]:
    """The Beam options the run sets (ours are summed up by the fingerprint)."""
    skip = {"runner", "pipeline_type_check"}
    chosen = {k: v for k, v in parsed.options.get_all_options(drop_default=True).items() if k not in skip}
    return ["runner options: " + " ".join(f"{k}={v}" for k, v in sorted(chosen.items()))] if chosen else []
