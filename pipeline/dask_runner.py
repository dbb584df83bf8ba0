"""`--runner DaskRunner`: the runner's public entry and the questions the CLI asks about its options.

The runner itself (Beam's Dask runner with its translation corrected) reaches into Beam's runner
internals, so it lives in the quarantine, pipeline/beam_internals/dask.py, whose docstring lists the
faults it works around; this module only names it (pipeline/parse.py maps every spelling of the Dask
runner to `rollout_relabel.pipeline.dask_runner.DaskRunner`) and reads the runner's public options.
"""
from __future__ import annotations

import json
from urllib.parse import urlsplit

from rollout_relabel.pipeline.beam_internals.dask import DaskOptions, DaskRunner, bag_options, translate

__all__ = ["DaskOptions", "DaskRunner", "bag_options", "local_cluster_wanted", "scheduler_is_local", "translate"]

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1", "")


def local_cluster_wanted(options) -> bool:
    """No scheduler named: the run starts a LocalCluster on this machine."""
    dask = options.view_as(DaskOptions)
    return not dask.address and not dask.scheduler_file


def scheduler_is_local(options) -> bool:
    """Whether the workers share this machine: a LocalCluster, or a scheduler on a loopback address
    (a scheduler listening on loopback only takes workers from this machine)."""
    if local_cluster_wanted(options):
        return True
    dask = options.view_as(DaskOptions)
    address = dask.address or _scheduler_file_address(dask.scheduler_file)
    if not address:  # a scheduler file not written yet: its scheduler may be anywhere
        return False
    parts = urlsplit(address if "://" in address else "tcp://" + address)
    if parts.scheme == "inproc":
        return True
    host = parts.hostname or ""
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def _scheduler_file_address(path: str | None) -> str | None:
    """The address a scheduler wrote to its --scheduler-file (JSON with "address")."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle).get("address")
    except (OSError, ValueError, TypeError, AttributeError):
        return None
