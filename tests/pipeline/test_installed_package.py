"""The pipeline as remote workers run it: the project installed from its wheel, the SDK harness in
other processes behind Beam's portable Job API (as Flink and Spark on Kubernetes run it).

Nothing here may import the source tree: the driver and the worker pool run in a venv that holds the
wheel and sees this venv's dependencies through a plain path entry (so the editable install's import
hook, which would fall back to the source tree, is never loaded), from a directory outside the repo.
"""
import os
import socket
import subprocess
import time

from rollout_relabel.pipeline.generate import RunSpec, write_parquet_run, write_pt_run
from tests.conftest import run_cli


def test_the_venv_imports_the_wheel_not_the_source_tree(installed):
    python, env, site, work = installed
    names = ("rollout_relabel.pipeline.run", "rollout_relabel.transforms.core.advantages", "rollout_relabel.schemas",
             "rollout_relabel.beam")
    code = f"import {', '.join(names)}; print({', '.join(n + '.__file__' for n in names)})"
    where = subprocess.run([python, "-c", code],
                           env=env, cwd=work, capture_output=True, text=True, check=True).stdout.split()
    assert len(where) == 4 and all(w.startswith(str(site)) for w in where), where


def test_portable_runner_with_external_workers_matches_in_process(installed, tmp_path):
    python, env, _, work = installed
    inputs = tmp_path / "in"
    write_parquet_run(RunSpec(steps=2, prompts_per_step=4, files_per_step=2, seed=3), inputs / "parquet")
    write_pt_run(RunSpec(steps=1, prompts_per_step=3, seed=4), inputs / "dumps", flavor="slime")
    run_cli("run", "--input", inputs, "--output", tmp_path / "in_process")

    port = _free_port()
    pool = subprocess.Popen([python, "-m", "apache_beam.runners.worker.worker_pool_main", f"--service_port={port}"],
                            env=env, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for_port(port, pool)
        proc = subprocess.run([python, "-m", "rollout_relabel", "run", "--input", inputs,
                               "--output", tmp_path / "workers",
                               "--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=EXTERNAL",
                               f"--environment_config=localhost:{port}"],
                              env=env, cwd=work, capture_output=True, text=True, timeout=300)
    finally:
        pool.terminate()
        log = pool.communicate(timeout=30)[0]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "written + 0 dead" in proc.stdout
    assert "Starting worker with command" in log  # the DoFns ran in the pool's worker processes
    names = sorted(os.listdir(tmp_path / "in_process"))
    assert names == sorted(os.listdir(tmp_path / "workers"))
    for name in names:
        assert (tmp_path / "in_process" / name).read_bytes() == (tmp_path / "workers" / name).read_bytes(), name


def _free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _wait_for_port(port, process, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"worker pool exited: {process.communicate()[0][-2000:]}")
        try:
            socket.create_connection(("localhost", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"worker pool did not listen on {port}")
