"""pipeline/beam_internals/dask.py: every Beam name the Dask runner's translation uses past Beam's public
API exists in the installed Beam, and none is used without being pinned."""
import pathlib

import apache_beam as beam
import pytest

pytest.importorskip("distributed")

from rollout_relabel.pipeline.beam_internals import dask  # noqa: E402
from tests.pipeline.beam_internals.pinned import check_pinned, names_used, resolve  # noqa: E402

SOURCE = pathlib.Path(dask.__file__)
# AsSideInput sets these members in __init__: they are looked up on a side input of a real pipeline
INSTANCES = {beam.pvalue.AsSideInput: lambda: beam.pvalue.AsList(beam.Pipeline() | beam.Create([0]))}


def test_every_private_name_the_dask_translation_uses_is_pinned_and_in_the_installed_beam():
    check_pinned(SOURCE, dask.PINNED_NAMES, INSTANCES)


def test_the_pins_cover_the_runner_internals_and_the_private_members():
    used, loose = names_used(SOURCE)
    assert "apache_beam.runners.common._OutputHandler" in used
    assert "apache_beam.runners.dask.overrides._Create" in used
    assert {"_view_options", "_window_mapping_fn", "_extract_bag_kwargs"} <= loose
    assert len(dask.PINNED_NAMES) >= 20


def test_a_name_beam_does_not_have_fails_to_resolve():
    with pytest.raises(AttributeError):
        resolve("apache_beam.runners.dask.overrides._NoSuchTransform")


def test_a_private_use_left_out_of_the_pins_is_found(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from apache_beam.runners import common\nfrom apache_beam.runners.common import Receiver\n"
                      "x = common._OutputHandler\ny = thing._secret\n")
    with pytest.raises(AssertionError, match="without pinning"):
        check_pinned(module, ("apache_beam.runners.common.Receiver",))
    used, loose = names_used(module)
    assert used == {"apache_beam.runners.common._OutputHandler", "apache_beam.runners.common.Receiver"}
    assert loose == {"_secret"}


def test_the_public_entry_is_the_quarantined_runner():
    from rollout_relabel.pipeline.dask_runner import DaskRunner
    from rollout_relabel.pipeline.parse import DASK_RUNNER

    assert resolve(DASK_RUNNER) is DaskRunner is dask.DaskRunner
