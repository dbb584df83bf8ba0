"""The pipeline in Beam's multi_processing mode: nothing relies on shared memory or unpicklable state."""
import os

from rollout_relabel.pipeline.generate import RunSpec, write_parquet_run
from tests.conftest import run_cli


def test_multi_processing_matches_in_process(tmp_path):
    inputs = tmp_path / "in"
    write_parquet_run(RunSpec(steps=2, prompts_per_step=4, files_per_step=2, seed=3), inputs)
    run_cli("run", "--input", inputs, "--output", tmp_path / "single")
    proc = run_cli("run", "--input", inputs, "--output", tmp_path / "multi",
                   "--direct_running_mode=multi_processing", "--direct_num_workers=2", subprocess_=True)
    assert "written + 0 dead" in proc.stdout
    names = sorted(os.listdir(tmp_path / "single"))
    assert names == sorted(os.listdir(tmp_path / "multi"))
    for name in names:
        assert (tmp_path / "single" / name).read_bytes() == (tmp_path / "multi" / name).read_bytes(), name
