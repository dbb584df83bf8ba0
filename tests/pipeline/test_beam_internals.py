"""pipeline/beam_internals.py: the private Beam APIs we reach past, checked against the installed Beam."""
from apache_beam.runners.worker import statesampler
from apache_beam.utils.counters import CounterFactory

from rollout_relabel.pipeline.beam_internals import resource_hint_names, sample_states_often


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
