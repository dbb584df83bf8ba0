"""The few private Python and Beam APIs the project uses, each with why no public one serves.

Everything else goes through public APIs; keep this module the only place that reaches past them.
"""
from __future__ import annotations

import atexit
import os


def quick_exit(code: int) -> None:
    """Run the exit handlers, then end the process without tearing the interpreter down.

    Teardown after a run (Beam's, gRPC's and pyarrow's objects) takes long and does nothing for the
    user: every output is committed by then. Python has no public call that runs the atexit handlers
    and then exits without teardown, hence atexit._run_exitfuncs.
    """
    atexit._run_exitfuncs()  # noqa: SLF001
    os._exit(code)


def resource_hint_names() -> dict[str, str]:
    """Beam resource hint URN -> its canonical (first registered) short name, for the dry run's plan.

    Beam exposes parsing hints by name but no public map from a hint's URN back to its name.
    """
    from apache_beam.transforms.resources import ResourceHint

    names: dict[str, str] = {}
    for name, cls in ResourceHint._name_to_known_hints.items():  # noqa: SLF001
        names.setdefault(cls.urn, name)
    return names
