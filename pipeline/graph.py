"""The top-level pipeline: build(p, ...) wires the stages; run() builds and runs it."""
from __future__ import annotations

import apache_beam as beam

from pipeline.inputs import InputFile
from pipeline.plan import group_by_batch_sharing
from pipeline.settings import RunSettings
from transforms.gather_batches import GatherBatches
from transforms.group_advantages import GroupAdvantages
from transforms.join_and_write import JoinAndWrite
from transforms.read_rollouts import ReadRollouts
from transforms.relabel_files import RelabelFileGroups
from transforms.write_manifest import WriteManifest
from transforms.write_records import WriteRecords

DEAD_LETTERS_NAME = "dead_letters.parquet"
FILTERED_NAME = "filtered.parquet"


def read_stat(element):
    source, record = element
    return dict(record, kind="read", source=source)


def batch_stat(counters):
    return dict(counters, kind="batch")


def build(p: beam.Pipeline, settings: RunSettings, files: list[InputFile], groups=None):
    """Add the relabel graph to `p`; returns the PCollection holding the manifest dict.

    Only the stages the inputs need are built: the shuffle path exists only when
    some group of files is too big for one worker, filtered.parquet only with
    --drop-uniform-groups (every unused stage costs start-up time on every runner).
    `groups`: group_by_batch_sharing(files), when the caller has it already.
    """
    lineage = dict(settings.semantics_record(), fingerprint=settings.fingerprint())
    groups, shared = groups or group_by_batch_sharing(files)  # (one-pass groups, shuffle-path files)

    one_pass = (p | "ListFileGroups" >> beam.Create([[f.record() for f in g] for g in groups])
                | "RelabelFileGroups" >> RelabelFileGroups(
                    settings.core, settings.reward_key, settings.drop_uniform_groups, settings.device,
                    settings.fail_fast, settings.output, lineage).with_resource_hints(
                        **dict(settings.core_resource_hints)))
    outputs = {name: [getattr(one_pass, name)] for name in ("stats", "files", "dead", "filtered", "counters")}
    if shared:
        shuffled = _shuffle_path(p, settings, shared, lineage)
        for name, collection in shuffled.items():
            outputs[name].append(collection)

    dead = (outputs["dead"]
            | "FlattenDeadLetters" >> beam.Flatten()
            | "WriteDeadLetters" >> WriteRecords(settings.output, DEAD_LETTERS_NAME, "dead", lineage))
    records = [dead]
    if settings.drop_uniform_groups:
        records.append(outputs["filtered"]
                       | "FlattenFiltered" >> beam.Flatten()
                       | "WriteFiltered" >> WriteRecords(settings.output, FILTERED_NAME, "filtered", lineage))
    stats = (
        *outputs["stats"],
        *records,
        outputs["files"] | "FlattenFileRecords" >> beam.Flatten() | "ReadStats" >> beam.Map(read_stat),
        outputs["counters"] | "FlattenBatchCounters" >> beam.Flatten() | "BatchStats" >> beam.Map(batch_stat),
    ) | "FlattenStats" >> beam.Flatten()
    return stats | "WriteManifest" >> WriteManifest(
        settings.output, lineage, settings.fingerprint(), [f.record() for f in files], settings.max_dead_fraction)


def _shuffle_path(p, settings: RunSettings, shared: list[InputFile], lineage: dict) -> dict:
    """Batches spread over more files than one worker should hold: slim rows meet in a shuffle."""
    read = (p | "ListSharedBatchFiles" >> beam.Create([f.record() for f in shared])
            | "ReadRollouts" >> ReadRollouts(settings.reward_key, settings.fail_fast))
    batches = read.slim | "GatherBatches" >> GatherBatches()
    computed = batches | "GroupAdvantages" >> GroupAdvantages(
        settings.core, settings.drop_uniform_groups, settings.device, settings.fail_fast).with_resource_hints(
            **dict(settings.core_resource_hints))
    written = ((read.files, computed.results, computed.dead, computed.filtered)
               | "JoinAndWrite" >> JoinAndWrite(settings.output, lineage))
    dead = (read.dead, written.dead) | "FlattenShuffleDeadLetters" >> beam.Flatten()
    return {"stats": written.stats, "files": read.files, "dead": dead, "filtered": written.filtered,
            "counters": computed.counters}
