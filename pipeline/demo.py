"""`relabel demo`: generate a small realistic run in three formats and relabel each one."""
from __future__ import annotations

import os
import shutil
import tempfile

from rollout_relabel.pipeline.generate import RunSpec, write_parquet_run, write_pt_run
from rollout_relabel.pipeline.run import run
from rollout_relabel.transforms.lib.errors import UsageError

DATASETS = (
    # (folder, how it is written, extra run options)
    ("parquet", "parquet", []),
    ("slime", "slime", []),
    ("miles", "miles", []),
    ("miles_reward_dict", "miles-reward-dict", ["--reward-key", "acc"]),
)


def generate_demo(workdir: str, seed: int = 0) -> dict[str, str]:
    """Write the demo inputs under workdir/inputs/<dataset>; returns dataset -> folder.

    Each dataset is generated in a scratch folder first, then its files are moved in under their names,
    replacing a previous demo's: a folder holding any other file (the user's own) is refused (UsageError)
    before anything is written, and nothing else is ever deleted (docs/bad-input.md)."""
    spec = RunSpec(steps=3, prompts_per_step=8, samples_per_prompt=8, files_per_step=2, seed=seed)
    folders = {}
    os.makedirs(os.path.join(workdir, "inputs"), exist_ok=True)
    with tempfile.TemporaryDirectory(dir=os.path.join(workdir, "inputs"), prefix=".demo-") as scratch:
        generated = {}
        for name, kind, _ in DATASETS:
            staging = os.path.join(scratch, name)
            if kind == "parquet":
                write_parquet_run(spec, staging)
            else:
                write_pt_run(spec, staging, flavor=kind)
            generated[name] = staging
            folder = os.path.join(workdir, "inputs", name)
            if os.path.lexists(folder) and not os.path.isdir(folder):
                raise UsageError(f"--workdir {workdir}: {folder} exists and is not a folder; choose another --workdir")
            foreign = sorted(set(os.listdir(folder)) - set(os.listdir(staging))) if os.path.isdir(folder) else []
            if foreign:
                raise UsageError(f"--workdir {workdir}: {folder} holds {foreign[0]}, which relabel demo does not "
                                 "write; choose another --workdir (the demo replaces only its own files)")
        for name, staging in generated.items():
            folder = os.path.join(workdir, "inputs", name)
            os.makedirs(folder, exist_ok=True)
            for entry in sorted(os.listdir(staging)):
                target = os.path.join(folder, entry)
                if os.path.isdir(target) and not os.path.islink(target):
                    raise UsageError(f"--workdir {workdir}: {target} is a folder where relabel demo writes a file")
                shutil.move(os.path.join(staging, entry), target)
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
