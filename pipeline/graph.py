"""The `relabel run` pipeline: build(p, settings, files) wires the stages; pipeline/run.py runs it."""
from __future__ import annotations

import hashlib
from dataclasses import replace

import apache_beam as beam

from rollout_relabel.transforms.commit_run import CommitRun
from rollout_relabel.transforms.gather_batches import GatherBatches
from rollout_relabel.transforms.group_advantages import GroupAdvantages
from rollout_relabel.transforms.join_and_write import JoinAndWrite
from rollout_relabel.transforms.lib.io.input_file import InputFile
from rollout_relabel.transforms.lib.io.plan import group_by_batch_sharing
from rollout_relabel.transforms.lib.output.part_files import batch_inputs
from rollout_relabel.transforms.lib.output.stage_outputs import (
    COUNTERS,
    DEAD,
    FILES,
    FILTERED,
    RESULTS,
    SLIM,
    STATS,
    ExcludedRows,
)
from rollout_relabel.transforms.lib.settings import RunSettings
from rollout_relabel.transforms.read_rollouts import ReadRollouts
from rollout_relabel.transforms.relabel_file_groups import RelabelFileGroups
from rollout_relabel.transforms.rescore_rollouts import RescoreRollouts
from rollout_relabel.transforms.score_with_reward_model import ScoreWithRewardModel


def build(p: beam.Pipeline, settings: RunSettings, files: list[InputFile], groups=None):
    """Add the relabel graph to `p`; returns the PCollection holding the manifest dict.

    Only the stages the inputs need are built: the shuffle path exists only when
    some group of files is too big for one worker, _filtered.parquet only when rows
    can be filtered: --drop-uniform-groups, --max-staleness, --keep-band (every unused stage costs start-up
    time on every runner).
    `groups`: group_by_batch_sharing(files), when the caller has it already.
    """
    # (one-pass groups, shuffle-path files)
    groups, shared = groups or group_by_batch_sharing(files, batch_from=settings.labeling.batch_from,
                                                      step=settings.labeling.step_column())
    hints = dict(settings.core_resource_hints)

    one_pass = p | "ListFileGroups" >> beam.Create([list(g) for g in groups])
    if settings.rescoring is not None:
        one_pass = one_pass | "RescoreRollouts" >> _rescore(settings)
    one_pass = one_pass | "RelabelFileGroups" >> RelabelFileGroups(settings).with_resource_hints(**hints)
    outputs = {tag: [one_pass[tag]] for tag in (STATS, FILES, DEAD, FILTERED, COUNTERS)}
    if shared:
        for tag, collection in _shuffle_path(p, settings, shared).items():
            outputs[tag].append(collection)

    kinds = [DEAD, FILTERED]  # filtered rows come from options and from presets (not-trained rows)
    records = [outputs[kind]
               | f"Flatten{kind.title()}Records" >> beam.Flatten()
               | f"Mark{kind.title()}Records" >> beam.Map(ExcludedRows, kind) for kind in kinds]
    items = (
        *outputs[STATS],
        *records,
        outputs[FILES] | "FlattenFileEntries" >> beam.Flatten() | "ReadStats" >> beam.Map(_file_read),
        outputs[COUNTERS] | "FlattenBatchCounters" >> beam.Flatten(),
    ) | "FlattenStats" >> beam.Flatten()
    # the record files and the manifest in one stage after the last group (each stage costs a bundle)
    return items | "CommitRun" >> CommitRun(settings, [f.entry() for f in files])


def _rescore(settings: RunSettings) -> beam.PTransform:
    """The rescore stage: RunInference for --reward-model, the verifier's calls otherwise."""
    if settings.rescoring.model is not None:
        return ScoreWithRewardModel(settings)
    return RescoreRollouts(settings)


def _digest(digests: list[str]) -> str:
    return hashlib.sha256("\n".join(sorted(digests)).encode()).hexdigest()[:16]


def _with_rewards_of(f: InputFile, digest: str) -> InputFile:
    """The input whose batch inputs' identity covers every sibling's rewards (in its part file's lineage)."""
    return replace(f, batch_inputs=f"{f.batch_inputs}+rewards:{digest}")


def _file_read(element):
    """(source, FileRead) -> the FileRead (keyed by source for JoinAndWrite; the manifest needs no key)."""
    return element[1]


def _shuffle_path(p, settings: RunSettings, shared: list[InputFile]) -> dict:
    """Batches spread over more files than one worker should hold: slim rows meet in a shuffle."""
    # the shuffle path's files are one set of siblings: a change to any of them redoes them all
    siblings = batch_inputs(shared)
    listed = p | "ListSharedBatchFiles" >> beam.Create([replace(f, batch_inputs=siblings) for f in shared])
    if settings.rescoring is not None:
        rescored = (listed | "OneFileGroups" >> beam.Map(lambda entry: [entry])
                    | "RescoreSharedBatchFiles" >> _rescore(settings)
                    | "FileEntries" >> beam.FlatMap(lambda group: group))
        # siblings share batches: a reward changed in one file changes the others' advantages too
        every = (rescored | "EachFilesRewards" >> beam.Map(lambda f: f.rewards or "")
                 | "AllRewards" >> beam.combiners.ToList() | "RewardsDigest" >> beam.Map(_digest))
        listed = rescored | "WithSiblingsRewards" >> beam.Map(_with_rewards_of, beam.pvalue.AsSingleton(every))
    read = listed | "ReadRollouts" >> ReadRollouts(settings)
    batches = read[SLIM] | "GatherBatches" >> GatherBatches()
    computed = batches | "GroupAdvantages" >> GroupAdvantages(settings).with_resource_hints(
        **dict(settings.core_resource_hints))
    written = ((read[FILES], computed[RESULTS], computed[DEAD], computed[FILTERED])
               | "JoinAndWrite" >> JoinAndWrite(settings))
    dead = (read[DEAD], written[DEAD]) | "FlattenShuffleDeadLetters" >> beam.Flatten()
    return {STATS: written[STATS], FILES: read[FILES], DEAD: dead, FILTERED: written[FILTERED],
            COUNTERS: computed[COUNTERS]}
