"""pipeline/beam_internals/__init__.py: the private Python and Beam APIs we reach past, checked against the
installed Beam; and the quarantine holds: nothing outside it reaches Beam's private or runner-internal names."""
import ast
import pathlib

from apache_beam.runners.worker import statesampler
from apache_beam.utils.counters import CounterFactory

from rollout_relabel.pipeline import beam_internals
from rollout_relabel.pipeline.beam_internals import resource_hint_names, sample_states_often
from tests.conftest import ROOT
from tests.pipeline.beam_internals.pinned import check_pinned, private


def test_in_process_bundles_sample_states_often(monkeypatch):
    # Beam's own class (a run earlier in this process may have swapped it), put back afterwards
    beams = next(c for c in statesampler.StateSampler.__mro__ if "relabel_period_ms" not in vars(c))
    monkeypatch.setattr(statesampler, "StateSampler", beams)
    default = statesampler.StateSampler("stage", CounterFactory())
    assert default.sampling_period_ms == statesampler.DEFAULT_SAMPLING_PERIOD_MS
    sample_states_often(5)
    swapped = statesampler.StateSampler
    sampler = swapped("stage", CounterFactory())  # as Beam's bundle processor builds it
    assert sampler.sampling_period_ms == 5 < statesampler.DEFAULT_SAMPLING_PERIOD_MS
    sampler.start()
    sampler.stop()  # the thread Beam joins at a bundle's end
    sample_states_often(5)
    assert statesampler.StateSampler is swapped  # once only, however often a process runs pipelines


def test_resource_hint_names_are_the_short_names():
    names = resource_hint_names()
    assert "accelerator" in names.values() and "min_ram" in names.values()


def test_every_private_name_the_package_uses_is_pinned_and_exists():
    check_pinned(pathlib.Path(beam_internals.__file__), beam_internals.PINNED_NAMES)


def test_nothing_outside_the_quarantine_imports_a_private_name_or_reads_beam_runner_internals():
    root = pathlib.Path(ROOT)
    outside = [p for folder in ("pipeline", "transforms", "schemas", "rollout_relabel", "bench")
               for p in sorted((root / folder).glob("**/*.py")) if "beam_internals" not in p.parts]
    offenders = {}
    for path in outside:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("apache_beam"):
                names = [a.name for a in node.names if private(a.name)]
                if names or node.module.startswith(("apache_beam.runners.dask.", "apache_beam.runners.common")):
                    offenders.setdefault(str(path.relative_to(root)), []).append(node.module)
    assert offenders == {}
