"""The quarantine: the private Python and Beam APIs the project uses, each with why no public one serves.

This package is the only place that reaches past public APIs (ruff's SLF rule fails anywhere else):
this module for the three uses of the command line, dask.py for the Dask runner's translation. Each
name used is checked against the installed Beam by tests/pipeline/test_beam_internals.py and
tests/pipeline/beam_internals/test_dask.py.
"""
from __future__ import annotations

import atexit
import os

# Every name below that public APIs do not offer (tests/pipeline/test_beam_internals.py resolves each one
# in the installed Python and Beam, and reads this file's source for any use not listed).
PINNED_NAMES = (
    "atexit._run_exitfuncs",
    "apache_beam.transforms.resources.ResourceHint",
    "apache_beam.transforms.resources.ResourceHint._name_to_known_hints",
    "apache_beam.runners.worker.statesampler.StateSampler",
)


def quick_exit(code: int) -> None:
    """Run the exit handlers, then end the process without tearing the interpreter down.

    Teardown after a run (Beam's, gRPC's and pyarrow's objects) takes long and does nothing for the
    user: every output is committed by then. Python has no public call that runs the atexit handlers
    and then exits without teardown, hence atexit._run_exitfuncs.
    """
    atexit._run_exitfuncs()
    os._exit(code)


def resource_hint_names() -> dict[str, str]:
    """Beam resource hint URN -> its canonical (first registered) short name, for the dry run's plan.

    Beam exposes parsing hints by name but no public map from a hint's URN back to its name.
    """
    from apache_beam.transforms.resources import ResourceHint

    names: dict[str, str] = {}
    for name, cls in ResourceHint._name_to_known_hints.items():
        names.setdefault(cls.urn, name)
    return names


def sample_states_often(period_ms: int = 10) -> None:
    """In this process, Beam's state sampler samples every `period_ms` instead of its default period.

    Each bundle's sampler thread sleeps a whole period between samples, and the bundle joins it when it
    ends: an in-process bundle that ran long finishes up to a full default period after its last element,
    and a run waits that long once for each long stage. Beam takes the period
    as a constructor argument but no option sets it, so the class its bundle processor builds is swapped
    for a subclass with a shorter default. The samples only feed step-time metrics; sampling more often
    costs one wakeup a period. Runners whose workers run elsewhere never see this.
    """
    from apache_beam.runners.worker import statesampler

    current = statesampler.StateSampler
    if getattr(current, "relabel_period_ms", None) == period_ms:
        return

    class OftenSampledStates(current):
        relabel_period_ms = period_ms

        def __init__(self, prefix, counter_factory, sampling_period_ms=period_ms):
            super().__init__(prefix, counter_factory, sampling_period_ms)

    statesampler.StateSampler = OftenSampledStates
