"""`python -m bench.first_group RELABEL_ARGS...`: `relabel` with one probe, for the start-up figure.

The probe notes the wall-clock time (time.time()) at which the first file group
starts being relabelled and writes it to the file named by $RELABEL_BENCH_FIRST_GROUP;
the launcher noted the time just before it started the process, so the difference
is the start-up the user waits through. Everything else is `relabel` as installed:
the same imports, options, listing, footers, graph and runner.
"""
from __future__ import annotations

import os
import sys
import time

ENV = "RELABEL_BENCH_FIRST_GROUP"


def main() -> None:
    path = os.environ[ENV]
    import rollout_relabel.transforms.relabel_file_groups as stage

    original = stage.RelabelFileGroupFn.process
    noted = []

    def process(self, group):
        if not noted:  # two threads may both get here first: either time is the first, give or take
            noted.append(time.time())
            with open(path, "w") as f:
                f.write(repr(noted[0]))
        yield from original(self, group)

    stage.RelabelFileGroupFn.process = process  # the in-process runner unpickles the class by reference
    from rollout_relabel.pipeline.cli import entry

    sys.argv = ["relabel", *sys.argv[1:]]
    entry()


if __name__ == "__main__":
    main()
