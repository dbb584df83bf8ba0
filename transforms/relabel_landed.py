"""RelabelLandedFiles: each group of landed files relabelled as `relabel run` would, then recorded.

The work is RelabelFileGroupFn's (the same function writes the same bytes as
`relabel run`); this stage adds what a stream needs: each input's dead
letters and filtered rows in their own file (dead_letters/<part name>,
filtered/<part name>), a per-input record (_watch/<part stem>.json, written
last: the input is done), and the manifest rewritten from the records after
every group. A stop request (Ctrl-C) is honoured between groups: a group not
started is left for the next watch.
"""
from __future__ import annotations

import json

import apache_beam as beam
import pyarrow as pa
from apache_beam import pvalue

from pipeline import watch_records
from transforms import rows
from transforms.core.config import CoreConfig
from transforms.group_advantages import COUNTERS
from transforms.join_and_write import DEAD, FILTERED
from transforms.metrics import counter
from transforms.read_rollouts import FILES
from transforms.relabel_files import RelabelFileGroupFn
from transforms.write_records import ConcatTablesFn, WriteRecordsFn

LATE_REASON = "late-batch-file"


def split_outputs(outputs) -> dict:
    """RelabelFileGroupFn's tagged outputs, by tag (main: 'stats')."""
    by_tag = {"stats": [], FILES: [], DEAD: [], FILTERED: [], COUNTERS: []}
    for output in outputs:
        if isinstance(output, pvalue.TaggedOutput):
            by_tag[output.tag].append(output.value)
        else:
            by_tag["stats"].append(output)
    return by_tag


class RelabelLandedFn(beam.DoFn):
    def __init__(self, config: CoreConfig, reward_key, drop_uniform_groups, device, output_dir, lineage: dict,
                 fingerprint: str):
        self._group_fn = RelabelFileGroupFn(config, reward_key, drop_uniform_groups, device, False, output_dir,
                                            lineage)
        self._output_dir = output_dir
        self._lineage = lineage
        self._fingerprint = fingerprint

    def setup(self):
        self._group_fn.setup()

    def process(self, release_json):
        release = json.loads(release_json)
        files = release["files"]
        if watch_records.stop_requested(self._output_dir):
            counter("files_left_for_restart").inc(len(files))
            return
        if release["late"]:
            by_tag = split_outputs(())
            for f in files:
                message = (f"{f['path']}: its steps were already relabelled from other files (a later step had "
                           "landed); its rows were not in their statistics. Relabel the run with `relabel run`")
                by_tag[DEAD].append(rows.file_dead_letter(f["path"], LATE_REASON, message))
                by_tag[FILES].append((f["path"], {"output": None, "rows_in": 0, "reason": LATE_REASON}))
        else:
            by_tag = split_outputs(self._group_fn.process(files))
        dead, filtered = by_source(by_tag[DEAD]), by_source(by_tag[FILTERED])
        for position, f in enumerate(files):
            record = self._record(f, files, by_tag, dead.get(f["path"]), filtered.get(f["path"]),
                                  first=position == 0)
            watch_records.write_record(self._output_dir, record)
            counter("files_done").inc()
            yield {"path": f["path"], "output": f["output"], "rows_out": sum(
                s["rows_out"] for s in record["stats"] if s["kind"] == "file")}
        watch_records.write_watch_manifest(self._output_dir, self._lineage, self._fingerprint, "running")

    def _record(self, item: dict, group: list[dict], by_tag: dict, dead, filtered, first: bool) -> dict:
        from pipeline.inputs import InputFile
        from pipeline.plan import step_range

        source = item["path"]
        stats = [dict(r, kind="read", source=s) for s, r in by_tag[FILES] if s == source]
        stats += [s for s in by_tag["stats"] if s["source"] == source]
        if first:  # a batch may span the group's files: its counters go with the first one
            stats += [dict(c, kind="batch") for c in by_tag[COUNTERS]]
        dead = self._write_records(item, dead, watch_records.DEAD_LETTERS_DIR, "dead")
        filtered = self._write_records(item, filtered, watch_records.FILTERED_DIR, "filtered")
        steps = step_range(InputFile(source, item["output"], item["size"], item["mtime"]))
        return {"input": item, "fingerprint": self._fingerprint, "steps": list(steps) if steps else None,
                "group": [f["output"] for f in group], "stats": stats, "dead": dead, "filtered": filtered}

    def _write_records(self, item, mine, directory, kind) -> dict:
        """This input's records (a table, or None), sorted as `relabel run` sorts them, in directory/<part name>."""
        from apache_beam.io.filesystems import FileSystems

        table = ConcatTablesFn().extract_output([mine] if mine is not None else [])
        target = FileSystems.join(self._output_dir, directory)
        summary = next(iter(WriteRecordsFn(target, item["output"], kind, self._lineage).process(table)))
        stale = FileSystems.join(target, item["output"])
        if not table.num_rows and FileSystems.exists(stale):  # the input changed since it was last relabelled
            FileSystems.delete([stale])
        return summary


def by_source(tables: list) -> dict:
    """source -> that input's records, from the group's record tables."""
    tables = [t for t in tables if t.num_rows]
    return rows.split_by_source(pa.concat_tables(tables)) if tables else {}


class RelabelLandedFiles(beam.PTransform):
    """PCollection[JSON release] -> PCollection[{path, output, rows_out}] per input done."""

    def __init__(self, config: CoreConfig, reward_key, drop_uniform_groups, device, output_dir, lineage: dict,
                 fingerprint: str):
        super().__init__()
        self._fn = RelabelLandedFn(config, reward_key, drop_uniform_groups, device, output_dir, lineage, fingerprint)

    def expand(self, releases):
        return releases | "RelabelEachRelease" >> beam.ParDo(self._fn)
