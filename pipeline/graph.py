"""The top-level pipeline: build(p, ...) wires the stages; run() builds and runs it."""
from __future__ import annotations

import apache_beam as beam

from pipeline.inputs import InputFile
from pipeline.settings import RunSettings
from transforms.gather_batches import GatherBatches
from transforms.group_advantages import GroupAdvantages
from transforms.join_and_write import JoinAndWrite
from transforms.read_rollouts import ReadRollouts
from transforms.write_manifest import WriteManifest
from transforms.write_records import WriteRecords

DEAD_LETTERS_NAME = "dead_letters.parquet"
FILTERED_NAME = "filtered.parquet"


def read_stat(element):
    source, record = element
    return dict(record, kind="read", source=source)


def batch_stat(counters):
    return dict(counters, kind="batch")


def build(p: beam.Pipeline, settings: RunSettings, files: list[InputFile]):
    """Add the relabel graph to `p`; returns the PCollection holding the manifest dict."""
    lineage = dict(settings.semantics_record(), fingerprint=settings.fingerprint())
    sources = p | "ListInputs" >> beam.Create([f.record() for f in files])
    read = sources | "ReadRollouts" >> ReadRollouts(settings.reward_key, settings.fail_fast)
    batches = read.slim | "GatherBatches" >> GatherBatches()
    computed = batches | "GroupAdvantages" >> GroupAdvantages(
        settings.core, settings.drop_uniform_groups, settings.device, settings.fail_fast)
    written = ((read.files, computed.results, computed.dead, computed.filtered)
               | "JoinAndWrite" >> JoinAndWrite(settings.output, lineage))
    dead = ((read.dead, written.dead)
            | "FlattenDeadLetters" >> beam.Flatten()
            | "WriteDeadLetters" >> WriteRecords(settings.output, DEAD_LETTERS_NAME, "dead", lineage))
    filtered = written.filtered | "WriteFiltered" >> WriteRecords(
        settings.output, FILTERED_NAME, "filtered", lineage)
    stats = (
        written.stats,
        dead,
        filtered,
        read.files | "ReadStats" >> beam.Map(read_stat),
        computed.counters | "BatchStats" >> beam.Map(batch_stat),
    ) | "FlattenStats" >> beam.Flatten()
    return stats | "WriteManifest" >> WriteManifest(
        settings.output, lineage, settings.fingerprint(), [f.record() for f in files], settings.max_dead_fraction)
