"""The output directory as a whole: its manifest, what a run removes, its options, and stop files."""
from __future__ import annotations

import json
import os

from rollout_relabel.transforms.lib.errors import STOPS, RunStopped, UsageError
from rollout_relabel.transforms.lib.io import filesystem
from rollout_relabel.transforms.lib.output import output_files
from rollout_relabel.transforms.lib.output.manifest import MANIFEST_NAME

DEAD_LETTERS_NAME = "dead_letters.parquet"
FILTERED_NAME = "filtered.parquet"
STOP_NAME = "_stop.json"  # a worker's RunStopped, for the driver (see errors.py)
# what `relabel watch` keeps besides part files (transforms/lib/watch/ledger.py)
WATCH_FOLDERS = ("_watch", "dead_letters", "filtered")
TEMP_PROBE = "_write-probe"  # written and deleted before a run: can the output be written at all?


def read_manifest(output: str) -> dict | None:
    return output_files.read_json(filesystem.join(output, MANIFEST_NAME))


def remove_run_outputs(output: str, part_names) -> None:
    """Delete the manifest (first, so nothing looks complete meanwhile), the record files (a watch's
    folders of them too), temporary files, a stop file and the named part files. Part files not named
    stay: a resumed run skips the complete ones."""
    names = [MANIFEST_NAME, DEAD_LETTERS_NAME, FILTERED_NAME, STOP_NAME, *WATCH_FOLDERS] + [n for n in part_names if n]
    paths = [filesystem.join(output, n) for n in names]
    filesystem.delete_existing(paths + temporary_files(output))


def temporary_files(output: str) -> list[str]:
    """Temporary files left in output (and a watch's record folders) by writers that were killed: any there
    while this run holds the output's lease are stale."""
    folders = [output] + [filesystem.join(output, d) for d in WATCH_FOLDERS]
    return [m.path for folder in folders
            for m in filesystem.match(filesystem.join(folder, output_files.TEMP_PREFIX + "*"))]


def part_bytes(output: str) -> dict[str, int]:
    """The committed part files in output and their sizes, from one listing."""
    return {m.path.replace("\\", "/").rsplit("/", 1)[-1]: int(m.size_in_bytes)
            for m in filesystem.match(filesystem.join(output, "part-*.parquet"))}


def parts_intact(output: str, manifest: dict) -> bool:
    """Whether every part file the manifest lists is there with its recorded size (a listing, no reads)."""
    found = part_bytes(output)
    return all(found.get(i["output"]) == i.get("output_bytes") for i in manifest["inputs"] if i.get("output"))


def refuse_other_options(output: str, what: str, found: str | None, fingerprint: str) -> None:
    """The one refusal of an output made with other options: `what` in `output` carries fingerprint
    `found`; unless it is this run's, the user must pass --overwrite."""
    if found != fingerprint:
        raise UsageError(f"{output} holds {what} made with other options (fingerprint {found} != {fingerprint}); "
                         "pass --overwrite to replace it")


def stop_run(output: str, error: RunStopped) -> RunStopped:
    """Commit a worker's stop file (the driver reads it back as this type); returns the error to raise."""
    record = {"kind": type(error).__name__, "message": str(error)}
    output_files.write_bytes_atomically(json.dumps(record, sort_keys=True).encode(), output, STOP_NAME)
    return error


def read_stop(output: str) -> RunStopped | None:
    """The RunStopped a worker committed in `output`, as its type, or None."""
    record = output_files.read_json(filesystem.join(output, STOP_NAME))
    if record is None or record.get("kind") not in STOPS:
        return None
    return STOPS[record["kind"]](record["message"])


def make_writable(output: str, flag: str = "--output") -> None:
    """Create the output directory and prove a file can be committed in it, or raise UsageError naming why
    (an existing file in the way, no permission, a store that refuses): before any work is done."""
    probe = TEMP_PROBE
    try:
        if "://" not in output and os.path.exists(output) and not os.path.isdir(output):
            raise UsageError(f"{flag} {output}: is an existing file, not a directory")
        filesystem.mkdirs(output)
        # not empty: S3 refuses to complete a multipart upload that has no part
        output_files.write_bytes_atomically(b"probe", output, probe)
        filesystem.delete([filesystem.join(output, probe)])
    except UsageError:
        raise
    except Exception as error:  # noqa: BLE001 - every store has its own error types; the user needs the text
        raise UsageError(f"{flag} {output}: cannot be written: {error}") from None
