#!/usr/bin/env bash
# CPU/GPU parity and the numeric core's GPU throughput, in one run of under ten minutes.
#
#   bash bench/gpu_check.sh            # on a machine with an NVIDIA GPU, from anywhere
#
# It installs what it needs (a venv beside the repo's, from constraints.txt: on Linux torch==2.13.0
# from PyPI is the CUDA build) unless the current python already has the project's dependencies and
# a GPU, then prints: the GPU, the parity test (every semantics x estimator, the core's torch path on
# CUDA against its numpy path on the CPU within 1e-5 and against the plain-Python reference), the CLI on --device cuda against --device cpu, and
# the core's rows/s on the GPU for the benchmark's M dataset (1M rows).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch, apache_beam, pyarrow, pytest, hypothesis, yaml; assert torch.cuda.is_available()" 2>/dev/null; then
  "$PY" -m venv .venv-gpu
  PY=.venv-gpu/bin/python
  "$PY" -m pip install --quiet -c constraints.txt -e '.[test]'
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
echo "== device"
"$PY" -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"

echo "== parity: numeric core on cuda vs cpu and the reference"
RELABEL_TEST_DEVICE=cuda "$PY" -m pytest -q tests/transforms/core/test_device_parity.py

echo "== parity: relabel run --device cuda vs --device cpu"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$PY" -c "from rollout_relabel.pipeline.generate import RunSpec, write_parquet_run; \
write_parquet_run(RunSpec(steps=4, prompts_per_step=32, files_per_step=2, seed=21), '$WORK/in')"
"$PY" -m pipeline run --input "$WORK/in" --output "$WORK/cpu" --device cpu > /dev/null
"$PY" -m pipeline run --input "$WORK/in" --output "$WORK/cuda" --device cuda > /dev/null
"$PY" - "$WORK" <<'PY'
import os, sys
import numpy as np, pyarrow.parquet as pq
work = sys.argv[1]
parts = sorted(n for n in os.listdir(f"{work}/cpu") if n.startswith("part-"))
worst = 0.0
for name in parts:
    a, b = pq.read_table(f"{work}/cpu/{name}"), pq.read_table(f"{work}/cuda/{name}")
    assert a.drop_columns(["advantage"]).equals(b.drop_columns(["advantage"])), name
    worst = max(worst, float(np.abs(a["advantage"].to_numpy() - b["advantage"].to_numpy()).max()))
assert worst <= 1e-5, worst
print(f"{len(parts)} files: every column equal, max |advantage cuda - cpu| = {worst:.3g}")
PY

echo "== numeric core throughput on cuda (M: 1M rows, 100 batches)"
"$PY" -c "from bench.datasets import DATASETS, ensure; ensure(DATASETS['M'], log=lambda *a: None)"
"$PY" -m bench.core_micro bench/data/M --repeat 10 --device cuda
"$PY" -m bench.core_micro bench/data/M --repeat 5
