"""RelabelOptions: every flag of `relabel run`, typed and validated in one place."""
from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions, TypeOptions

from pipeline.local_threads import MAX_LOCAL_THREADS, cores
from pipeline.settings import CompareSettings, RunSettings
from transforms.core.config import MAINSTREAM_POLICIES, ROW_UNIT_SEMANTICS, SEMANTICS, CoreConfig

DEFAULT_RUNNER = "FnApiRunner"  # in-process; the DirectRunner would try to download Prism

# Dataflow's grammar for worker_accelerator and the accelerator resource hint
ACCELERATOR = re.compile(r"type:[A-Za-z0-9_<>-]+;count:[1-9][0-9]*(;[a-z0-9-]+(:[^;]+)?)*")


class UsageError(ValueError):
    """Bad options or configuration: exit code 2, nothing written."""


class RelabelOptions(PipelineOptions):
    @classmethod
    def _add_argparse_args(cls, parser):
        group = parser.add_argument_group("rollout-relabel")
        group.add_argument("--input", dest="inputs", nargs="+", action="extend", default=None,
                           help="Parquet files, .pt dumps, directories or globs")
        group.add_argument("--output", help="output directory (local path or any Beam filesystem URL)")
        group.add_argument("--semantics", choices=SEMANTICS, default="rollout-mainstream",
                           help="normalization semantics (SEMANTICS.md)")
        group.add_argument("--estimator", default="grpo",
                           help="grpo, gspo, cispo, dr_grpo, reinforce_plus_plus_baseline, rloo; others pass through")
        group.add_argument("--std-normalization", dest="std_normalization", action=argparse.BooleanOptionalAction,
                           default=True, help="divide by the group std (grpo/gspo/cispo)")
        group.add_argument("--no-rewards-normalization", dest="rewards_normalization", action="store_false",
                           default=True, help="advantage = reward value, unchanged")
        group.add_argument("--reward-key", default=None, help="field of a struct/map reward to use")
        group.add_argument("--mainstream", choices=MAINSTREAM_POLICIES, default=None,
                           help="which row of a rollout supplies its reward (rollout semantics only)")
        group.add_argument("--drop-uniform-groups", action="store_true", default=False,
                           help="send groups whose rewards are all equal to filtered.parquet")
        group.add_argument("--n-samples-per-prompt", type=int, default=None)
        group.add_argument("--rollout-batch-size", type=int, default=None)
        group.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                           help="where the numeric core runs: cpu (numpy) or cuda (torch); "
                                "auto picks cuda on workers that have one")
        group.add_argument("--core-resource-hint", dest="core_resource_hints", action="append", default=None,
                           metavar="KEY=VALUE",
                           help="Beam resource hint for the stage running the numeric core, e.g. "
                                "accelerator=type:nvidia-l4;count:1;install-nvidia-driver or min_ram=16GB")
        group.add_argument("--fail-fast", action="store_true", default=False,
                           help="stop at the first bad input and leave no output files")
        group.add_argument("--max-dead-fraction", type=float, default=None,
                           help="abort (exit 3, nothing committed) when more than this fraction of rows is dead")
        group.add_argument("--overwrite", action="store_true", default=False,
                           help="replace an output directory made with other options")
        group.add_argument("--dry-run", dest="relabel_dry_run", action="store_true", default=False,
                           help="build and validate the pipeline, print its plan, run nothing")
        group.add_argument("--progress", dest="progress", action=argparse.BooleanOptionalAction, default=None,
                           help="show files done and rows so far on stderr (default: when stderr is a terminal)")


class CompareOptions(PipelineOptions):
    """`relabel compare` only (with every RelabelOptions labeling flag, which A and B override)."""

    @classmethod
    def _add_argparse_args(cls, parser):
        group = parser.add_argument_group("relabel compare")
        group.add_argument("--a", dest="compare_a", metavar="SPEC", help="labeling A: SEMANTICS[,estimator=E,std=on|off,...]")
        group.add_argument("--b", dest="compare_b", metavar="SPEC", help="labeling B: SEMANTICS[,estimator=E,std=on|off,...]")
        group.add_argument("--report", dest="compare_report", metavar="DIR", help="directory for report.json, report.md, plots")


def settings_from_options(options: PipelineOptions) -> RunSettings:
    """The one place options are read and checked."""
    opts = options.view_as(RelabelOptions)
    if not opts.inputs:
        raise UsageError("--input is required (files, directories or globs)")
    if not opts.output:
        raise UsageError("--output is required (a directory)")
    if opts.max_dead_fraction is not None and not 0 <= opts.max_dead_fraction <= 1:
        raise UsageError(f"--max-dead-fraction must be within [0, 1], got {opts.max_dead_fraction}")
    try:
        core = CoreConfig(
            semantics=opts.semantics, estimator=opts.estimator, std_normalization=opts.std_normalization,
            rewards_normalization=opts.rewards_normalization, mainstream=opts.mainstream,
            n_samples_per_prompt=opts.n_samples_per_prompt, rollout_batch_size=opts.rollout_batch_size)
    except ValueError as error:
        raise UsageError(str(error)) from error
    return RunSettings(
        core_resource_hints=core_resource_hints(opts.core_resource_hints or []),
        inputs=tuple(opts.inputs), output=opts.output, core=core, reward_key=opts.reward_key,
        drop_uniform_groups=opts.drop_uniform_groups, device=opts.device, fail_fast=opts.fail_fast,
        max_dead_fraction=opts.max_dead_fraction, overwrite=opts.overwrite, dry_run=opts.relabel_dry_run,
        progress=opts.progress)


def core_resource_hints(flags: list[str]) -> tuple[tuple[str, str], ...]:
    """KEY=VALUE flags checked against Beam's registered hints (and the accelerator's own grammar)."""
    from apache_beam.transforms.resources import parse_resource_hints

    hints = {}
    for flag in flags:
        key, sep, value = flag.partition("=")
        if not sep or not value:
            raise UsageError(f"--core-resource-hint {flag!r}: expected KEY=VALUE")
        try:
            parse_resource_hints({key: value})
        except ValueError as error:
            raise UsageError(f"--core-resource-hint {flag!r}: {error}") from error
        if key == "accelerator" and not ACCELERATOR.fullmatch(value):
            raise UsageError(f"--core-resource-hint {flag!r}: an accelerator is "
                             "'type:GPU_TYPE;count:N[;install-nvidia-driver]'")
        hints[key] = value
    return tuple(sorted(hints.items()))


# Keys of a --a/--b spec: (CoreConfig field or "drop_uniform_groups", value parser).
SPEC_KEYS = {
    "estimator": ("estimator", str),
    "std": ("std_normalization", "switch"),
    "std_normalization": ("std_normalization", "switch"),
    "rewards_normalization": ("rewards_normalization", "switch"),
    "mainstream": ("mainstream", str),
    "n_samples_per_prompt": ("n_samples_per_prompt", int),
    "rollout_batch_size": ("rollout_batch_size", int),
    "drop_uniform_groups": ("drop_uniform_groups", "switch"),
}
SWITCH = {"on": True, "true": True, "yes": True, "1": True, "off": False, "false": False, "no": False, "0": False}
NOT_FOR_COMPARE = (("output", "--output (compare writes --report DIR)"), ("fail_fast", "--fail-fast"),
                   ("max_dead_fraction", "--max-dead-fraction"), ("overwrite", "--overwrite"),
                   ("relabel_dry_run", "--dry-run"))


def compare_settings_from_options(options: PipelineOptions) -> CompareSettings:
    """`relabel compare`: the run options give both sides' defaults; each --a/--b spec overrides them."""
    from transforms.comparison import Side

    opts = options.view_as(RelabelOptions)
    compare = options.view_as(CompareOptions)
    if not opts.inputs:
        raise UsageError("--input is required (files, directories or globs)")
    for flag, name in (("--a", compare.compare_a), ("--b", compare.compare_b), ("--report", compare.compare_report)):
        if not name:
            raise UsageError(f"{flag} is required")
    for dest, flag in NOT_FOR_COMPARE:
        if getattr(opts, dest) not in (None, False):
            raise UsageError(f"{flag} does not apply to relabel compare")
    base = {"estimator": opts.estimator, "std_normalization": opts.std_normalization,
            "rewards_normalization": opts.rewards_normalization, "mainstream": opts.mainstream,
            "n_samples_per_prompt": opts.n_samples_per_prompt, "rollout_batch_size": opts.rollout_batch_size,
            "drop_uniform_groups": opts.drop_uniform_groups}
    sides = []
    for flag, spec in (("--a", compare.compare_a), ("--b", compare.compare_b)):
        values = parse_side(flag, spec, base)
        drop = values.pop("drop_uniform_groups")
        try:
            sides.append(Side(CoreConfig(**values), drop, spec))
        except ValueError as error:
            raise UsageError(f"{flag} {spec}: {error}") from error
    return CompareSettings(inputs=tuple(opts.inputs), report=compare.compare_report, a=sides[0], b=sides[1],
                           reward_key=opts.reward_key, device=opts.device, progress=opts.progress)


def parse_side(flag: str, spec: str, base: dict) -> dict:
    """`legacy-reshape,estimator=grpo,std=off` -> CoreConfig keyword values (and drop_uniform_groups)."""
    semantics, *pairs = [part.strip() for part in spec.split(",")]
    if semantics not in SEMANTICS:
        raise UsageError(f"{flag} {spec}: unknown semantics {semantics!r}; choose one of {', '.join(SEMANTICS)}")
    values = dict(base, semantics=semantics)
    if semantics in ROW_UNIT_SEMANTICS:
        values["mainstream"] = None  # the run-wide --mainstream is for rollout semantics; a spec may still say it
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in SPEC_KEYS:
            raise UsageError(f"{flag} {spec}: unknown setting {pair!r}; use key=value with keys "
                             f"{', '.join(SPEC_KEYS)}")
        name, kind = SPEC_KEYS[key]
        text = text.strip()
        try:
            if kind == "switch":
                values[name] = SWITCH[text.lower()]
            else:
                values[name] = kind(text)
        except (KeyError, ValueError) as error:
            raise UsageError(f"{flag} {spec}: {key}={text!r} is not a valid value") from error
    return values


def full_parser(command: str = "run"):
    """A parser that knows every pipeline option (ours and Beam's runners'), as Beam builds it.

    CompareOptions' flags exist for `relabel compare` only and WatchOptions' for `relabel watch` only:
    the other commands refuse them (Beam registers every options class globally). "any" knows them all.
    """
    from apache_beam.options.pipeline_options import _BeamArgumentParser

    only_for = {CompareOptions: "compare", WatchOptions: "watch"}
    parser = _BeamArgumentParser(allow_abbrev=False)
    for cls in {str(c): c for c in PipelineOptions.__subclasses__()}.values():
        if command != "any" and only_for.get(cls, command) != command:
            continue
        cls._add_argparse_args(parser)  # noqa: SLF001 - Beam's own way to list every option
    return parser


def pipeline_options(argv: list[str], command: str = "run") -> PipelineOptions:
    """Parse argv strictly (an unknown flag is a usage error) and pin the in-process runner."""
    _, unknown = full_parser(command).parse_known_args(argv)
    if unknown:
        raise UsageError(f"unknown option(s): {' '.join(unknown)}")
    options = PipelineOptions(argv)
    if options.view_as(StandardOptions).runner is None:
        options.view_as(StandardOptions).runner = DEFAULT_RUNNER
    if owns_local_threads(argv, options, command):
        use_local_threads(options, min(cores(), MAX_LOCAL_THREADS))  # `run` lowers it once inputs are known
    if not _given(argv, "--pipeline_type_check", "--no_pipeline_type_check"):
        # our DoFns carry no type hints: Beam's inference only costs start-up time (~0.5 s)
        options.view_as(TypeOptions).pipeline_type_check = False
    return options


def _given(argv: list[str], *flags: str) -> bool:
    """Whether the user passed any of these flags (as --flag or --flag=value)."""
    return any(a.split("=", 1)[0] in flags for a in argv)


def owns_local_threads(argv: list[str], options: PipelineOptions, command: str) -> bool:
    """Whether the worker threads are ours to choose: the default local runner, neither flag given."""
    return (command in ("run", "compare") and options.view_as(StandardOptions).runner == DEFAULT_RUNNER
            and not _given(argv, "--direct_running_mode", "--direct_num_workers"))


def use_local_threads(options: PipelineOptions, threads: int) -> None:
    """Run on `threads` in-process worker threads (one: the plain in-memory runner, no gRPC workers)."""
    from apache_beam.options.pipeline_options import DirectOptions

    direct = options.view_as(DirectOptions)
    direct.direct_running_mode = "multi_threading" if threads > 1 else "in_memory"
    direct.direct_num_workers = threads


class WatchOptions(PipelineOptions):
    """`relabel watch` only: how the input is polled and when the watch stops."""

    @classmethod
    def _add_argparse_args(cls, parser):
        group = parser.add_argument_group("rollout-relabel watch")
        group.add_argument("--poll-interval", type=float, default=5.0,
                           help="seconds between two listings of the input")
        group.add_argument("--stop-after-idle", type=float, default=None,
                           help="stop when no input file appeared or changed for this many seconds")
        group.add_argument("--stop-after-files", type=int, default=None,
                           help="stop once this many input files were handed to relabelling")
        group.add_argument("--require-marker", action="store_true", default=False,
                           help="relabel a file only once <file>.done or _SUCCESS in its folder exists")


@dataclass(frozen=True)
class WatchSettings:
    poll_interval: float
    stop_after_idle: float | None
    stop_after_files: int | None
    require_marker: bool


def watch_settings_from_options(options: PipelineOptions, settings: RunSettings) -> WatchSettings:
    """The one place watch options are read and checked (run options: settings_from_options)."""
    opts = options.view_as(WatchOptions)
    if opts.poll_interval <= 0:
        raise UsageError(f"--poll-interval must be positive, got {opts.poll_interval}")
    if opts.stop_after_idle is not None and opts.stop_after_idle < 0:
        raise UsageError(f"--stop-after-idle must be >= 0, got {opts.stop_after_idle}")
    if opts.stop_after_files is not None and opts.stop_after_files < 1:
        raise UsageError(f"--stop-after-files must be >= 1, got {opts.stop_after_files}")
    for flag, used in (("--fail-fast", settings.fail_fast), ("--max-dead-fraction", settings.max_dead_fraction),
                       ("--dry-run", settings.dry_run)):
        if used not in (None, False):
            raise UsageError(f"{flag} is a `relabel run` option; `relabel watch` does not support it")
    return WatchSettings(opts.poll_interval, opts.stop_after_idle, opts.stop_after_files, opts.require_marker)
