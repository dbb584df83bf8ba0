"""run(argv): options -> inputs -> output directory checks -> pipeline -> manifest -> outcome."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import DirectOptions

from pipeline import manifest as manifest_lib
from pipeline import progress
from pipeline.graph import DEAD_LETTERS_NAME, FILTERED_NAME, build
from pipeline.inputs import expand_inputs
from pipeline.local_threads import available_memory, local_thread_count
from pipeline.options import UsageError, owns_local_threads, pipeline_options, settings_from_options, use_local_threads
from pipeline.plan import group_by_batch_sharing, read_footers
from pipeline.run_config import expand_config
from pipeline.runner_checks import RunnerCheck, check_runner
from transforms import sinks


@dataclass
class RunOutcome:
    exit_code: int
    output: str
    manifest: dict | None = None
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        lines = list(self.notes)
        if self.manifest:
            c = self.manifest["counts"]
            run = self.manifest["run"]
            lines += [
                f"semantics   {run['semantics']} v{run['semantics_version']}, estimator {run['estimator']}"
                f", std {'on' if run['std_normalization'] else 'off'}",
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
                             + f"  -> {FileSystems.join(self.output, dead['file'])}")
            else:
                lines.append("dead letters none")
            lines.append(f"output      {self.output}")
        return "\n".join(lines)


def parse(argv: list[str], command: str = "run"):
    argv = expand_config(list(argv))
    options = pipeline_options(argv, command)
    settings = settings_from_options(options)
    if owns_local_threads(argv, options, command):
        settings = replace(settings, local_threads=options.view_as(DirectOptions).direct_num_workers)
    return options, settings


def run(argv: list[str], test_pipeline: beam.Pipeline | None = None) -> RunOutcome:
    options, settings = parse(argv)
    runner_check = check_runner(options, settings)
    files = expand_inputs(settings.inputs, settings.output)
    if not files:
        raise UsageError(f"no .pt or .parquet files found under {' '.join(settings.inputs)}")
    output = settings.output

    previous = read_manifest(output)
    if previous is not None:
        same_inputs = [(i["path"], i["size"], i["mtime"]) for i in previous["inputs"]] == [
            (f.path, f.size, f.mtime) for f in files]
        same_options = previous.get("fingerprint") == settings.fingerprint()
        if same_options and same_inputs and not settings.overwrite:
            return RunOutcome(0, output, previous, ["already complete: the output matches these inputs and "
                                                    "options; nothing to do"])
        if not same_options and not settings.overwrite:
            raise UsageError(f"{output} holds a run made with other options (fingerprint "
                             f"{previous.get('fingerprint')} != {settings.fingerprint()}); pass --overwrite to "
                             "replace it")
        wanted = {f.output for f in files}
        stale = [i.get("output") for i in previous["inputs"]
                 if settings.overwrite or i.get("output") not in wanted]
        if not settings.dry_run:
            remove_run_outputs(output, stale)
    elif not settings.dry_run:
        _check_partial_output(output, files, settings)

    footers = read_footers(files)
    one_pass, shared = groups = group_by_batch_sharing(files, footers=footers)
    if settings.local_threads:
        group_bytes = [sum(footers[f.path].decoded_bytes for f in group) for group in one_pass]
        use_local_threads(options, local_thread_count(settings.local_threads, group_bytes, available_memory(),
                                                      shuffled=bool(shared)))
    if settings.dry_run:
        return RunOutcome(0, output, None, [plan(options, settings, files, runner_check, groups)])

    FileSystems.mkdirs(output) if not FileSystems.exists(output) else None
    pipeline = test_pipeline if test_pipeline is not None else beam.Pipeline(options=options)
    build(pipeline, settings, files, groups)
    try:
        with progress.showing(progress.part_files(output, [f.output for f in files]), len(files), "relabel run",
                              settings.progress):
            pipeline.run().wait_until_finish()
    except Exception as error:  # noqa: BLE001 - map the pipeline's failure to an exit code
        text = f"{type(error).__name__}: {error}"
        for marker, code, cleanup in (("FailFast", 3, True), ("TooManyDeadRows", 3, True),
                                      ("AccountingError", 1, False)):
            if marker in text:
                if cleanup:
                    remove_run_outputs(output, [f.output for f in files])
                return RunOutcome(code, output, None, [f"relabel: stopped: {_first_line(error, marker)}"])
        raise
    manifest = read_manifest(output)
    if manifest is None:
        return RunOutcome(1, output, None, ["relabel: the pipeline finished but wrote no manifest"])
    return RunOutcome(manifest_lib.exit_code(manifest), output, manifest)


def _check_partial_output(output, files, settings):
    """An interrupted run resumes; one made with other options must not be mixed with this one."""
    from transforms.sinks import read_lineage

    for f in files:
        lineage = read_lineage(output, f.output)
        if lineage is not None and lineage.get("fingerprint") != settings.fingerprint():
            if not settings.overwrite:
                raise UsageError(f"{output} holds {f.output} made with other options (fingerprint "
                                 f"{lineage.get('fingerprint')} != {settings.fingerprint()}); pass --overwrite "
                                 "to replace it")
            remove_run_outputs(output, [g.output for g in files])
            return
    remove_run_outputs(output, [])


def read_manifest(output: str) -> dict | None:
    return sinks.read_json(FileSystems.join(output, manifest_lib.MANIFEST_NAME))


def remove_run_outputs(output: str, part_names) -> None:
    """Delete the manifest (first, so nothing looks complete meanwhile), the record files, temporary
    files and the named part files. Part files not named stay: a resumed run skips the complete ones."""
    names = [manifest_lib.MANIFEST_NAME, DEAD_LETTERS_NAME, FILTERED_NAME] + [n for n in part_names if n]
    paths = [FileSystems.join(output, n) for n in names]
    paths += [m.path for m in sinks.match_paths(FileSystems.join(output, sinks.TEMP_PREFIX + "*"))]
    sinks.delete_existing(paths)


def plan(options, settings, files, runner_check: RunnerCheck, groups) -> str:
    """Build the graph with the run's options, prove it serializes for workers, and describe it."""
    from apache_beam.pipeline import PipelineVisitor

    pipeline = beam.Pipeline(runner="FnApiRunner", options=options)
    build(pipeline, settings, files, groups)
    pipeline.to_runner_api()  # pickles every DoFn, as submitting to a remote runner would
    lines = [f"dry run: runner {runner_check.runner} ({runner_check.family}), {len(files)} input files, "
             f"output {settings.output}, fingerprint {settings.fingerprint()}",
             *runner_check.describe(), *runner_options(options), "stages:"]

    class Describe(PipelineVisitor):
        def enter_composite_transform(self, node):
            if node.full_label and node.full_label.count("/") == 0:
                hints = describe_hints(node.transform.get_resource_hints() if node.transform else {})
                lines.append(f"  {node.full_label}" + (f"  [{hints}]" if hints else ""))

    pipeline.visit(Describe())
    lines.append("nothing was submitted")
    return "\n".join(lines)


def runner_options(options) -> list[str]:
    """The Beam options the run sets (ours are summed up by the fingerprint)."""
    import argparse

    from pipeline.options import RelabelOptions

    ours = argparse.ArgumentParser()
    RelabelOptions._add_argparse_args(ours)  # noqa: SLF001
    skip = {a.dest for a in ours._actions} | {"runner", "pipeline_type_check"}  # noqa: SLF001
    chosen = {k: v for k, v in options.get_all_options(drop_default=True).items() if k not in skip}
    return ["runner options: " + " ".join(f"{k}={v}" for k, v in sorted(chosen.items()))] if chosen else []


def describe_hints(hints: dict) -> str:
    from apache_beam.transforms.resources import ResourceHint

    names: dict[str, str] = {}
    for name, cls in ResourceHint._name_to_known_hints.items():  # noqa: SLF001
        names.setdefault(cls.urn, name)  # the canonical name is registered first, aliases after it
    return " ".join(f"{names.get(urn, urn)}={value.decode()}" for urn, value in sorted(hints.items()))


def _first_line(error, marker):
    """The stop reason: the exception's own line of a worker traceback, else the first telling line."""
    for line in str(error).splitlines():
        if f"{marker}: " in line and "raise " not in line:
            return line.split(f"{marker}: ", 1)[1].strip()
    for line in str(error).splitlines():
        if marker in line or line.startswith(("non-", "missing", "mask", "unreadable", "unsafe", "partial")):
            return line.strip()
    return str(error).splitlines()[0] if str(error) else marker
