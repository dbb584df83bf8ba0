"""The CLI edge: each command's help, Beam's options on demand, usage errors as one line (exit 2)."""
import os

import pytest

from rollout_relabel.pipeline.flags import HELP_TOPICS, PARSERS
from rollout_relabel.transforms.lib.settings import Labeling
from tests.conftest import run_cli


@pytest.mark.parametrize("command", ["run", "watch", "compare", "difficulty"])
def test_each_commands_help_fits_a_screen_with_its_own_options_first(command):
    out = run_cli(command, "--help").stdout
    lines = out.splitlines()
    assert len(lines) <= 80
    assert lines[0].startswith(f"usage: relabel {command} ")
    assert "--input" in out and "--semantics" in out and f"`relabel {command} --help-beam`" in out
    assert "--runner" not in out.split("Any Beam pipeline option")[0]  # Beam's options are not listed here


def test_help_beam_lists_beams_options():
    out = run_cli("run", "--help-beam").stdout
    assert "--runner" in out and "--direct_num_workers" in out and "--temp_location" in out


def test_an_unknown_runner_is_a_usage_error_naming_the_runners(tmp_path):
    (tmp_path / "in").mkdir()
    proc = run_cli("run", "--input", tmp_path / "in", "--output", tmp_path / "o", "--runner", "Nope",
                   check_codes=(2,))
    assert "--runner Nope" in proc.stderr and "FnApiRunner" in proc.stderr and "DataflowRunner" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("make_output, says", [
    (lambda tmp: (tmp / "a-file").write_text("x") and tmp / "a-file", "is an existing file, not a directory"),
    (lambda tmp: (tmp / "a-file").write_text("x") and tmp / "a-file" / "sub", "cannot be written"),
])
def test_an_output_that_cannot_be_written_is_a_usage_error(tmp_path, make_output, says):
    from rollout_relabel.pipeline.generate import RunSpec, write_pt_run

    write_pt_run(RunSpec(steps=1, prompts_per_step=2), tmp_path / "in")
    output = make_output(tmp_path)
    proc = run_cli("run", "--input", tmp_path / "in", "--output", output, check_codes=(2,))
    assert says in proc.stderr and str(output) in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_every_labeling_option_has_one_flag_whose_dest_is_its_name():
    # what makes a new labeling option one field, one flag and a line of docs: settings are read by name
    for command in ("run", "watch", "compare"):
        dests = {a.dest for a in PARSERS[command]().declared}
        assert set(Labeling.option_names()) <= dests, command


def test_a_config_boolean_must_be_a_yaml_boolean(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text('drop_uniform_groups: "false"\n')
    (tmp_path / "in").mkdir()
    proc = run_cli("run", "--config", config, "--input", tmp_path / "in", "--output", tmp_path / "o",
                   check_codes=(2,))
    assert "drop_uniform_groups takes true or false, got 'false'" in proc.stderr


def test_the_collector_is_off_only_while_the_command_imports(monkeypatch):
    import gc

    from rollout_relabel.pipeline.cli import settle_heap

    frozen = gc.get_freeze_count()
    settle_heap()  # called by main() alone (tests, the Python API): the collector was never turned off
    assert gc.isenabled() and gc.get_freeze_count() == frozen
    gc.disable()  # as the console command's entry() does
    try:
        settle_heap()
        assert gc.isenabled() and gc.get_freeze_count() > frozen
    finally:
        gc.enable()
        gc.unfreeze()


def test_the_command_takes_jemalloc_on_linux_unless_the_user_named_a_pool(monkeypatch):
    import subprocess
    import sys

    import pyarrow as pa

    from rollout_relabel.pipeline.cli import MEMORY_POOL_ENV, choose_memory_pool

    here = "jemalloc" if sys.platform.startswith("linux") else pa.default_memory_pool().backend_name
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.delenv(MEMORY_POOL_ENV, raising=False)
    choose_memory_pool()
    assert MEMORY_POOL_ENV not in os.environ  # wheels without jemalloc: pyarrow's default stays
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv(MEMORY_POOL_ENV, "system")
    choose_memory_pool()
    assert os.environ[MEMORY_POOL_ENV] == "system"  # the user's choice

    # in a fresh process, as the console command runs it: before pyarrow's import, and Arrow then uses it
    env = {k: v for k, v in os.environ.items() if k != MEMORY_POOL_ENV}
    pool = subprocess.run([sys.executable, "-c", "from rollout_relabel.pipeline.cli import choose_memory_pool; "
                           "choose_memory_pool(); import pyarrow as pa; print(pa.default_memory_pool().backend_name)"],
                          env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert pool == here


def edge(work, capsys):
    """at_the_edge on work(): (exit code, stdout, stderr)."""
    from rollout_relabel.pipeline.cli import at_the_edge

    code = at_the_edge("export", work)
    out, err = capsys.readouterr()
    return code, out, err


def test_the_process_edge_gives_each_failure_its_code_and_one_line(capsys, monkeypatch):
    from rollout_relabel.pipeline.worker_output import TRACEBACK_ENV
    from rollout_relabel.transforms.lib.errors import ExitCode, UsageError

    monkeypatch.delenv(TRACEBACK_ENV, raising=False)

    def raising(error):
        def work():
            raise error
        return work

    assert edge(lambda: ExitCode.DEAD_LETTERS, capsys) == (3, "", "")
    code, out, err = edge(raising(UsageError("--to 'x': choose one of slime, miles")), capsys)
    assert (code, out, err) == (2, "", "relabel: error: --to 'x': choose one of slime, miles\n")
    code, _, err = edge(raising(KeyboardInterrupt()), capsys)
    assert code == 130 and err.startswith("relabel: interrupted:") and "rerun the same `relabel export`" in err
    assert err.count("\n") == 1
    code, _, err = edge(raising(OSError(28, "No space left on device")), capsys)
    assert code == 1 and err.startswith("relabel: failed: OSError: [Errno 28] No space left on device")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_the_process_edge_shows_the_traceback_on_request(capsys, monkeypatch):
    from rollout_relabel.pipeline.cli import at_the_edge
    from rollout_relabel.pipeline.worker_output import TRACEBACK_ENV

    monkeypatch.setenv(TRACEBACK_ENV, "1")

    def work():
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        at_the_edge("run", work)


@pytest.mark.parametrize("command", ["run", "compare"])
def test_no_rollout_files_names_every_suffix_read(tmp_path, command):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "notes.txt").write_text("not a rollout")
    extra = ("--output", tmp_path / "out") if command == "run" else (
        "--a", "group-index", "--b", "rollout-mainstream", "--report", tmp_path / "report")
    proc = run_cli(command, "--input", tmp_path / "in", *extra, check_codes=(2,))
    assert "no rollout files (.pt, .pth, .parquet, .pq, .jsonl, .jsonl.gz) found under" in proc.stderr


@pytest.mark.parametrize("topic", sorted(HELP_TOPICS))
def test_each_help_topic_lists_all_its_options_and_the_plain_help_points_to_it(topic):
    from rollout_relabel.transforms.core.option_facts import flag_of
    from rollout_relabel.transforms.lib.settings import option_facts
    flags = [flag_of(name, facts) for name, facts in option_facts().items() if facts.help_topic == topic]
    assert flags
    listed = run_cli("run", f"--help-{topic}").stdout
    assert all(flag in listed for flag in flags)
    plain = run_cli("run", "--help").stdout
    assert f"relabel run --help-{topic}" in plain and flags[0] in plain
