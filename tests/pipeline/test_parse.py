"""pipeline/parse.py: our flags and Beam's, split strictly, and nothing built that a run does not need."""
import pytest
from apache_beam.options.pipeline_options import TypeOptions

import rollout_relabel.pipeline.parse as parse_module
from rollout_relabel.pipeline.parse import parse
from rollout_relabel.transforms.lib.errors import UsageError

RUN = ["--input", "in", "--output", "out"]


def test_type_checking_is_off_unless_asked_for():
    assert parse("run", RUN).options.view_as(TypeOptions).pipeline_type_check is False
    # asked for, even with Beam's own default value: kept
    assert parse("run", RUN + ["--pipeline_type_check"]).options.view_as(TypeOptions).pipeline_type_check is True
    assert parse("run", RUN + ["--no_pipeline_type_check"]).options.view_as(TypeOptions).pipeline_type_check is False


def test_beams_option_list_is_built_only_for_beam_flags_or_a_config(monkeypatch, tmp_path):
    calls = []
    names = parse_module.beam_option_names
    monkeypatch.setattr(parse_module, "beam_option_names", lambda: (calls.append(1), names())[1])
    parse("run", RUN)
    assert calls == []  # no Beam flag, no config: nothing to check them against
    parse("run", RUN + ["--direct_num_workers=2"])
    assert len(calls) == 1
    config = tmp_path / "run.yaml"
    config.write_text("direct_num_workers: 2\n")
    parse("run", RUN + ["--config", str(config)])
    assert len(calls) == 3  # the config's keys, then what is left
    with pytest.raises(UsageError, match="--no_such_flag"):
        parse("run", RUN + ["--no_such_flag=1"])
