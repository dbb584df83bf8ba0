"""`relabel demo`: generate a small realistic run in three formats and relabel each one."""
from __future__ import annotations

import os
import shutil

from rollout_relabel.pipeline.generate import RunSpec, write_parquet_run, write_pt_run
from rollout_relabel.pipeline.run import run

DATASETS = (
    # (folder, how it is written, extra run options)
    ("parquet", "parquet", []),
    ("slime", "slime", []),
    ("miles", "miles", []),
    ("miles_reward_dict", "miles-reward-dict", ["--reward-key", "acc"]),
)


def generate_demo(workdir: str, seed: int = 0) -> dict[str, str]:
    """Write the demo inputs under workdir/inputs/<dataset>; returns dataset -> folder."""
    spec = RunSpec(steps=3, prompts_per_step=8, samples_per_prompt=8, files_per_step=2, seed=seed)
    folders = {}
    for name, kind, _ in DATASETS:
        folder = os.path.join(workdir, "inputs", name)
        shutil.rmtree(folder, ignore_errors=True)
        if kind == "parquet":
            write_parquet_run(spec, folder)
        else:
            write_pt_run(spec, folder, flavor=kind)
        folders[name] = folder
    return folders


def run_demo(workdir: str, seed: int = 0) -> int:
    folders = generate_demo(workdir, seed)
    worst = 0
    for name, _, extra in DATASETS:
        output = os.path.join(workdir, "outputs", name)
        argv = ["--input", folders[name], "--output", output, "--overwrite", *extra]
        print(f"\n== {name}: relabel run {' '.join(argv)}")
        outcome = run(argv)
        print(outcome.summary())
        worst = max(worst, outcome.exit_code)
    print(f"\ndemo finished: inputs under {workdir}/inputs, training rows under {workdir}/outputs")
    return worst
