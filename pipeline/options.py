"""RelabelOptions: every flag of `relabel run`, typed and validated in one place."""
from __future__ import annotations

import argparse
import re

from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions, TypeOptions

from pipeline.settings import RunSettings
from transforms.core.config import MAINSTREAM_POLICIES, SEMANTICS, CoreConfig

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
                           help="torch device of the numeric core, chosen on each worker")
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
        max_dead_fraction=opts.max_dead_fraction, overwrite=opts.overwrite, dry_run=opts.relabel_dry_run)


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


def full_parser():
    """A parser that knows every pipeline option (ours and Beam's runners'), as Beam builds it."""
    from apache_beam.options.pipeline_options import _BeamArgumentParser

    parser = _BeamArgumentParser(allow_abbrev=False)
    for cls in {str(c): c for c in PipelineOptions.__subclasses__()}.values():
        cls._add_argparse_args(parser)  # noqa: SLF001 - Beam's own way to list every option
    return parser


def pipeline_options(argv: list[str]) -> PipelineOptions:
    """Parse argv strictly (an unknown flag is a usage error) and pin the in-process runner."""
    _, unknown = full_parser().parse_known_args(argv)
    if unknown:
        raise UsageError(f"unknown option(s): {' '.join(unknown)}")
    options = PipelineOptions(argv)
    if options.view_as(StandardOptions).runner is None:
        options.view_as(StandardOptions).runner = DEFAULT_RUNNER
    if not any(a.split("=", 1)[0] in ("--pipeline_type_check", "--no_pipeline_type_check") for a in argv):
        # our DoFns carry no type hints: Beam's inference only costs start-up time (~0.5 s)
        options.view_as(TypeOptions).pipeline_type_check = False
    return options
