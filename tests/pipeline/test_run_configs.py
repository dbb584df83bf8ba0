"""Every run config in run_configs/ dry-runs: options validated, plan printed, nothing submitted or written."""
import os

import pytest

from rollout_relabel.pipeline.generate import RunSpec, write_parquet_run
from tests import memfs
from tests.conftest import ROOT, run_cli

CONFIGS = os.path.join(ROOT, "run_configs")
GPU = "type:nvidia-l4;count:1;install-nvidia-driver"


@pytest.fixture
def remote_inputs(tmp_path):
    """Inputs on a non-local filesystem, as remote workers need them."""
    write_parquet_run(RunSpec(steps=2, prompts_per_step=4, files_per_step=2, seed=8), tmp_path / "in")
    memfs.clear()
    for path in sorted((tmp_path / "in").rglob("*.parquet")):
        memfs.put("mem://bucket/run/" + path.name, path.read_bytes())
    yield "mem://bucket/run"
    memfs.clear()


def dry_run(config, inputs, *extra, codes=(0,)):
    return run_cli("run", "--dry-run", "--config", os.path.join(CONFIGS, config), "--input", inputs,
                   "--output", "mem://bucket/out", *extra, check_codes=codes)


@pytest.mark.parametrize("config, runner, fill_in", [
    ("local.yaml", "FnApiRunner (local)", []),
    ("local-multiprocess.yaml", "FnApiRunner (local)", []),
    ("dask.yaml", "DaskRunner (dask)", []),
    ("dataflow.yaml", "DataflowRunner (dataflow)", ["--project=<GCP_PROJECT>", "--region=<REGION>",
                                                    "--temp_location=gs://<BUCKET>/rollout-relabel/tmp"]),
    ("flink.yaml", "FlinkRunner (flink)", ["--flink_master=<FLINK_JOBMANAGER_HOST>:8081",
                                           "--environment_config=<REGISTRY>/rollout-relabel:0.1.0"]),
    ("spark.yaml", "SparkRunner (spark)", ["--spark_master_url=spark://<SPARK_MASTER_HOST>:7077",
                                           "--environment_config=<REGISTRY>/rollout-relabel:0.1.0"]),
])
def test_every_config_dry_runs(remote_inputs, config, runner, fill_in):
    out = dry_run(config, remote_inputs).stdout
    lines = out.splitlines()
    assert lines[0].startswith(f"dry run: runner {runner}, 4 input files, output mem://bucket/out")
    stages = lines[lines.index("stages:") + 1:lines.index("nothing was submitted")]
    assert [s.split()[0] for s in stages] == ["ListFileGroups", "RelabelFileGroups", "CommitRun"]
    fill = [line for line in lines if line.startswith("fill in before submitting: ")]
    if fill_in:
        assert all(f in fill[0] for f in fill_in), fill
    else:
        assert not fill
    assert memfs.keys("mem://bucket/out") == []


def test_dataflow_plan_puts_the_gpu_on_the_core_stage_only(remote_inputs):
    lines = dry_run("dataflow.yaml", remote_inputs).stdout.splitlines()
    assert f"  RelabelFileGroups  [accelerator={GPU}]" in lines
    assert "  CommitRun" in lines and "  ListFileGroups" in lines  # no hint elsewhere
    options = next(line for line in lines if line.startswith("runner options: "))
    assert f"dataflow_service_options=['worker_accelerator={GPU}']" in options
    assert "machine_type=g2-standard-8" in options


def test_command_line_overrides_the_config(remote_inputs):
    out = dry_run("dataflow.yaml", remote_inputs, "--project", "my-project-123", "--region", "us-central1",
                  "--core-resource-hint", "min_ram=16GB").stdout
    fill = next(line for line in out.splitlines() if line.startswith("fill in"))
    assert "--project" not in fill and "--region" not in fill and "--temp_location" in fill
    assert f"[accelerator={GPU} min_ram=16000000000]" in out


def test_a_real_submission_refuses_placeholders(remote_inputs):
    err = run_cli("run", "--config", os.path.join(CONFIGS, "dataflow.yaml"), "--input", remote_inputs,
                  "--output", "mem://bucket/out", check_codes=(2,)).stderr
    assert "placeholders: --project=<GCP_PROJECT>" in err
    assert memfs.keys("mem://bucket/out") == []


@pytest.mark.parametrize("config, extra, message", [
    ("dataflow.yaml", ["--core-resource-hint", "accelerator=nvidia-l4"],
     "an accelerator is 'type:GPU_TYPE;count:N[;install-nvidia-driver]'"),
    ("dataflow.yaml", ["--core-resource-hint", "gpu=1"], "Unknown resource hint: gpu"),
    ("dataflow.yaml", ["--core-resource-hint", "min_ram=lots"], "invalid value lots"),
    ("dataflow.yaml", ["--core-resource-hint", "accelerator=type:nvidia-t4;count:1"],
     "differs from the workers'"),
    ("dataflow.yaml", ["--dataflow_service_options", "worker_accelerator=nvidia-l4"],
     "worker_accelerator=nvidia-l4: expected"),
    ("flink.yaml", ["--environment_config="], "workers need the project"),
    ("dataflow.yaml", ["--setup_file", "requirements.txt"], "expects a setup.py or pyproject.toml"),
])
def test_malformed_runner_options_are_usage_errors(remote_inputs, config, extra, message):
    err = dry_run(config, remote_inputs, *extra, codes=(2,)).stderr
    assert message in err, err


def test_missing_required_option_is_named_by_beams_validator(remote_inputs, tmp_path):
    config = tmp_path / "dataflow-no-project.yaml"
    config.write_text("\n".join(line for line in open(os.path.join(CONFIGS, "dataflow.yaml"))
                                if not line.startswith("project:")))
    err = run_cli("run", "--dry-run", "--config", config, "--input", remote_inputs, "--output",
                  "mem://bucket/out", check_codes=(2,)).stderr
    assert "Missing required option: project" in err


def test_remote_runners_refuse_local_paths(tmp_path):
    write_parquet_run(RunSpec(steps=1, prompts_per_step=2, seed=1), tmp_path / "in")
    for config in ("dataflow.yaml", "flink.yaml", "spark.yaml"):
        err = run_cli("run", "--dry-run", "--config", os.path.join(CONFIGS, config), "--input", tmp_path / "in",
                      "--output", tmp_path / "out", check_codes=(2,)).stderr
        assert f"--input {tmp_path / 'in'}: " in err and "cannot reach a local path" in err
        assert f"--output {tmp_path / 'out'}: " in err
    assert not (tmp_path / "out").exists()


def test_filesystem_missing_from_this_install_is_named_with_its_extra(tmp_path):
    err = run_cli("run", "--dry-run", "--input", "gs://bucket/run/", "--output", tmp_path / "out",
                  check_codes=(2,)).stderr
    assert "no Beam filesystem for gs://: pip install 'apache-beam[gcp]==2.77.0'" in err


@pytest.mark.parametrize("command, flag", [("run", "--poll-interval=3"), ("run", "--a=legacy-reshape"),
                                           ("compare", "--stop-after-files=2")])
def test_another_commands_options_are_refused(tmp_path, command, flag):
    err = run_cli(command, "--input", tmp_path, "--output" if command == "run" else "--report", tmp_path / "o",
                  flag, check_codes=(2,)).stderr
    assert f"unknown option(s): {flag}" in err


@pytest.mark.parametrize("runner", ["DaskRunner", "daskrunner", "apache_beam.runners.dask.dask_runner.DaskRunner"])
def test_dask_runner_names_map_to_one_runner(tmp_path, runner):
    write_parquet_run(RunSpec(steps=1, prompts_per_step=2, seed=1), tmp_path / "in")
    lines = run_cli("run", "--dry-run", "--runner", runner, "--input", tmp_path / "in", "--output",
                    tmp_path / "out").stdout.splitlines()
    assert lines[0].startswith("dry run: runner DaskRunner (dask), 1 input files")
    assert lines[1].startswith("dask: a LocalCluster on this machine")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("address", ["tcp://127.0.0.1:8786", "localhost:8786", "tcp://[::1]:8786"])
def test_a_dask_scheduler_on_this_machine_reads_local_paths(tmp_path, address):
    write_parquet_run(RunSpec(steps=1, prompts_per_step=2, seed=1), tmp_path / "in")
    out = run_cli("run", "--dry-run", "--config", os.path.join(CONFIGS, "dask.yaml"), "--dask_client_address",
                  address, "--input", tmp_path / "in", "--output", tmp_path / "out").stdout
    assert f"dask: scheduler {address} (on this machine)" in out


def test_a_dask_scheduler_file_says_where_the_scheduler_is(tmp_path, monkeypatch):
    from rollout_relabel.pipeline import runner_checks

    monkeypatch.setattr(runner_checks, "mount_type", lambda path: "ext4")
    write_parquet_run(RunSpec(steps=1, prompts_per_step=2, seed=1), tmp_path / "in")
    scheduler = tmp_path / "scheduler.json"
    args = ("run", "--dry-run", "--runner", "DaskRunner", "--dask_scheduler_file", scheduler, "--input",
            tmp_path / "in", "--output", tmp_path / "out")
    scheduler.write_text('{"address": "tcp://127.0.0.1:8786", "type": "Scheduler"}')
    assert f"dask: the scheduler in {scheduler} (on this machine)" in run_cli(*args).stdout
    scheduler.write_text('{"address": "tcp://10.0.0.5:8786", "type": "Scheduler"}')
    assert "cannot reach" in run_cli(*args, check_codes=(2,)).stderr


def test_a_remote_dask_scheduler_needs_paths_its_workers_mount(tmp_path, monkeypatch, remote_inputs):
    from rollout_relabel.pipeline import runner_checks

    write_parquet_run(RunSpec(steps=1, prompts_per_step=2, seed=1), tmp_path / "in")
    remote = ("--config", os.path.join(CONFIGS, "dask.yaml"), "--dask_client_address", "tcp://10.0.0.5:8786")
    monkeypatch.setattr(runner_checks, "mount_type", lambda path: "ext4")
    err = run_cli("run", "--dry-run", *remote, "--input", tmp_path / "in", "--output", tmp_path / "out",
                  check_codes=(2,)).stderr
    assert f"--input {tmp_path / 'in'}: it is on this machine's ext4 filesystem" in err
    assert f"--output {tmp_path / 'out'}: " in err
    err = run_cli("compare", *remote, "--input", tmp_path / "in", "--a", "legacy-reshape", "--b",
                  "rollout-mainstream", "--report", tmp_path / "report", check_codes=(2,)).stderr
    assert f"--report {tmp_path / 'report'}: it is on this machine's ext4 filesystem" in err
    # on a filesystem the workers mount too (NFS, Lustre, ...) or a shared store, the same paths are fine
    monkeypatch.setattr(runner_checks, "mount_type", lambda path: "lustre")
    out = run_cli("run", "--dry-run", *remote, "--input", tmp_path / "in", "--output", tmp_path / "out").stdout
    assert "dask: scheduler tcp://10.0.0.5:8786" in out and "the project installed" in out
    run_cli("run", "--dry-run", *remote, "--input", remote_inputs, "--output", "mem://bucket/out")
    assert not (tmp_path / "out").exists() and not (tmp_path / "report").exists()


def test_mount_type_reads_the_mount_holding_a_path(tmp_path):
    from rollout_relabel.pipeline.runner_checks import mount_type

    mounts = tmp_path / "mounts"
    mounts.write_text("overlay / overlay rw 0 0\nfs1:/scratch /scratch nfs4 rw 0 0\n"
                      "tmpfs /scratch/tmp tmpfs rw 0 0\nmds@tcp:/lus /my\\040lustre lustre rw 0 0\n")
    assert mount_type("/scratch/runs/run-1/new-dir", str(mounts)) == "nfs4"
    assert mount_type("/scratch/tmp/x", str(mounts)) == "tmpfs"
    assert mount_type("/scratchy", str(mounts)) == "overlay"
    assert mount_type("/my lustre/runs", str(mounts)) == "lustre"
    assert mount_type("/x", str(tmp_path / "no-such-file")) == ""


def test_watch_on_dask_is_a_usage_error_naming_the_runners_that_can(tmp_path):
    err = run_cli("watch", "--runner", "DaskRunner", "--input", tmp_path, "--output", tmp_path / "out",
                  check_codes=(2,)).stderr
    assert "relabel watch needs a runner that runs unbounded pipelines" in err
    assert "FnApiRunner (the default), DataflowRunner or FlinkRunner" in err
    assert not (tmp_path / "out").exists()


def test_dask_options_need_the_dask_runner_and_the_dask_extra(tmp_path, monkeypatch):
    from rollout_relabel.pipeline import parse

    err = run_cli("run", "--input", tmp_path, "--output", tmp_path / "out", "--dask_client_address",
                  "tcp://127.0.0.1:8786", check_codes=(2,)).stderr
    assert "--dask_client_address: Dask options apply to --runner DaskRunner only" in err
    monkeypatch.setattr(parse, "dask_installed", lambda: False)
    err = run_cli("run", "--runner", "DaskRunner", "--input", tmp_path, "--output", tmp_path / "out",
                  check_codes=(2,)).stderr
    assert "--runner DaskRunner needs Dask: pip install -c constraints.txt 'rollout-relabel[dask]'" in err


@pytest.mark.parametrize("text, message", [
    # a few lines of aliases expand into gigabytes: refused before any is expanded
    ("a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: [*b, *b, *b, *b, *b]\n",
     "alias *a refused"),
    ("reward_key: acc\nreward_key: format\n", "key 'reward_key' is given twice (line 2)"),
    ("config: other.yaml\n", "key 'config': a run config cannot name another"),
    ("reward_key: [acc, format]\n", "reward_key takes one value, got a list"),
    ("n_samples_per_prompt: {a: 1}\n", "n_samples_per_prompt takes one value, got a dict"),
    ("columns: {reward: [a, b]}\n", "columns takes plain values, got a list"),
])
def test_a_config_that_hides_mistakes_is_a_usage_error_naming_the_key(tmp_path, text, message):
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    err = run_cli("run", "--dry-run", "--config", config, "--input", tmp_path, "--output", tmp_path / "out",
                  check_codes=(2,)).stderr
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_the_documented_dask_client_address_key_is_accepted(tmp_path):
    write_parquet_run(RunSpec(steps=1, prompts_per_step=2, files_per_step=1, seed=3), tmp_path / "in")
    config = tmp_path / "cluster.yaml"
    config.write_text("runner: DaskRunner\ndask_client_address: tcp://127.0.0.1:8786\n")
    out = run_cli("run", "--dry-run", "--config", config, "--input", tmp_path / "in", "--output",
                  tmp_path / "out").stdout
    assert "DaskRunner" in out
    assert "tcp://127.0.0.1:8786" in out  # the plan names the scheduler the config gave
