"""WriteManifest: every stage's statistics merged into _manifest.json, written last."""
from __future__ import annotations

import apache_beam as beam

from pipeline import manifest as manifest_lib
from transforms import sinks
from transforms.combiners import CollectFn


class WriteManifestFn(beam.DoFn):
    def __init__(self, output_dir: str, record: dict, fingerprint: str, inputs: list[dict],
                 max_dead_fraction: float | None):
        self._output_dir, self._record, self._fingerprint, self._inputs = output_dir, record, fingerprint, inputs
        self._max_dead_fraction = max_dead_fraction

    def process(self, stats):
        manifest = manifest_lib.build_manifest(self._record, self._fingerprint, self._inputs, stats,
                                               self._max_dead_fraction)
        sinks.write_bytes_atomically(manifest_lib.dumps(manifest), self._output_dir, manifest_lib.MANIFEST_NAME)
        yield manifest


class WriteManifest(beam.PTransform):
    """PCollection[stat dict] from every stage -> the manifest (also written to DIR/_manifest.json)."""

    def __init__(self, output_dir: str, record: dict, fingerprint: str, inputs: list[dict],
                 max_dead_fraction: float | None = None):
        super().__init__()
        self._fn = WriteManifestFn(output_dir, record, fingerprint, inputs, max_dead_fraction)

    def expand(self, stats):
        return (stats
                # every input file yields a stat, so no default is needed (it would cost a side input)
                | "CollectStats" >> beam.CombineGlobally(CollectFn()).without_defaults()
                | "WriteManifestJson" >> beam.ParDo(self._fn))
