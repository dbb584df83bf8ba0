"""`relabel watch` over a backlog: N files already in the folder when it starts, against `relabel run` on them.

    python -m bench.watch_backlog [--files 1000] [--poll-interval 0.2]

Each file is a small slime-style .pt dump (one step, a batch alone): both commands do the same
relabelling, so the difference is what the watch adds per file (its per-input records, the manifest,
the listing). Target: the watch within 2x of the run's wall time (the watch's cost per file must not
grow with the files already done). Both are fresh processes timed from here; the watch stops by
--stop-after-files N.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rollout_relabel.pipeline.generate import RunSpec, write_pt_run

ROOT = Path(__file__).resolve().parent.parent
TARGET_RATIO = 2.0


def timed(args: list[str]) -> float:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "rollout_relabel", *args], cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"relabel {' '.join(args[:1])} exited {proc.returncode}: {proc.stderr[-3000:]}")
    return wall


def measure(files: int, poll_interval: float = 0.2, log=print) -> dict:
    with tempfile.TemporaryDirectory() as work:
        inputs = Path(work) / "in"
        write_pt_run(RunSpec(steps=files, prompts_per_step=2, samples_per_prompt=4, seed=3), inputs)
        count = len(os.listdir(inputs))
        run_s = timed(["run", "--input", str(inputs), "--output", str(Path(work) / "run")])
        log(f"[watch backlog] relabel run over {count} files: {run_s:.1f} s")
        watch_s = timed(["watch", "--input", str(inputs), "--output", str(Path(work) / "watch"), "--poll-interval",
                         str(poll_interval), "--stop-after-files", str(count)])
        log(f"[watch backlog] relabel watch over the same {count} files (present at start): {watch_s:.1f} s")
        manifest = json.loads((Path(work) / "watch" / "_manifest.json").read_text())
        assert manifest["watch"]["files_done"] == count, manifest["watch"]
    ratio = watch_s / run_s
    return {"files": count, "run_s": run_s, "watch_s": watch_s, "ratio": ratio, "target": TARGET_RATIO,
            "met": ratio <= TARGET_RATIO}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--poll-interval", type=float, default=0.2)
    args = parser.parse_args(argv)
    result = measure(args.files, args.poll_interval)
    print(f"watch / run = {result['ratio']:.2f} (target <= {TARGET_RATIO:g}): "
          f"{'met' if result['met'] else 'NOT met'}")
    return 0 if result["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
