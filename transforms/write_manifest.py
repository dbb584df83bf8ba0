"""WriteManifest: every stage's statistics merged into _manifest.json, written last."""
from __future__ import annotations

import apache_beam as beam

from transforms.combiners import CollectFn
from transforms.lib import manifest as manifest_lib
from transforms.lib import output_files
from transforms.lib.errors import RunStopped
from transforms.lib.output_dir import part_bytes, stop_run
from transforms.lib.settings import RunSettings


class WriteManifestFn(beam.DoFn):
    def __init__(self, settings: RunSettings, inputs: list[dict]):
        self._settings, self._inputs = settings, inputs

    def process(self, stats):
        settings = self._settings
        try:
            manifest = manifest_lib.build_manifest(settings.lineage(), settings.fingerprint(), self._inputs, stats,
                                                   settings.max_dead_fraction, part_bytes(settings.output))
        except RunStopped as stopped:  # lost rows, or too many dead ones: never committed
            raise stop_run(settings.output, stopped) from None
        output_files.write_bytes_atomically(manifest_lib.dumps(manifest), settings.output, manifest_lib.MANIFEST_NAME)
        yield manifest


class WriteManifest(beam.PTransform):
    """PCollection[Stat] from every stage -> the manifest (also written to DIR/_manifest.json)."""

    def __init__(self, settings: RunSettings, inputs: list[dict]):
        super().__init__()
        self._fn = WriteManifestFn(settings, inputs)

    def expand(self, stats):
        return (stats
                # every input file yields a stat, so no default is needed (it would cost a side input)
                | "CollectStats" >> beam.CombineGlobally(CollectFn()).without_defaults()
                | "WriteManifestJson" >> beam.ParDo(self._fn))
