"""Latency of `relabel watch`: from a dump landing in the watched folder to its training rows being visible.

    python -m bench.watch_latency [--files 10] [--every 2.0] [--poll-interval 0.5] [--marker]

Generates slime-style .pt dumps, starts `relabel watch` on an empty folder,
lands one warm-up dump (not counted: start-up), then lands --files dumps
(written elsewhere and renamed in, as a producer should) every --every
seconds, and times each until its part file exists under its final name.
With --marker a `<dump>.done` marker is written right after the dump (the
watcher then need not wait for a second poll).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rollout_relabel.pipeline.generate import RunSpec, write_pt_run

ROOT = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10)
    parser.add_argument("--every", type=float, default=2.17,
                        help="seconds between two landings (not a multiple of the poll interval: landings fall "
                             "at every phase of a poll)")
    parser.add_argument("--poll-interval", type=float, default=0.5)
    parser.add_argument("--prompts", type=int, default=32, help="prompt groups per dump (8 rollouts each)")
    parser.add_argument("--marker", action="store_true")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        staging, inputs, output = work / "staging", work / "in", work / "out"
        inputs.mkdir()
        dumps = []
        for i in range(args.files + 1):
            written = write_pt_run(RunSpec(steps=1, prompts_per_step=args.prompts, seed=100 + i), staging / str(i))
            dumps.append(Path(written[0]).rename(staging / f"step-{i:04d}.pt"))
        watch = subprocess.Popen(
            [sys.executable, "-m", "rollout_relabel", "watch", "--input", str(inputs), "--output", str(output),
             "--poll-interval", str(args.poll_interval), "--stop-after-files", str(args.files + 1)]
            + (["--require-marker"] if args.marker else []),
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            started = time.monotonic()
            warm = land(dumps[0], inputs, args.marker)
            wait_visible(output / f"part-{dumps[0].stem}.parquet", watch)
            print(f"start-up + first dump: {time.monotonic() - started:.2f} s (not counted; landed at "
                  f"{warm - started:.2f} s)")
            latencies = []
            for dump in dumps[1:]:
                landed = land(dump, inputs, args.marker)
                visible = wait_visible(output / f"part-{dump.stem}.parquet", watch)
                latencies.append(visible - landed)
                print(f"{dump.name}  {dump.stat().st_size / 1e6:.2f} MB  landed -> visible {latencies[-1]:.3f} s")
                time.sleep(max(0.0, landed + args.every - time.monotonic()))
            out, err = watch.communicate(timeout=120)
            if watch.returncode != 0:
                print(out, err[-3000:], file=sys.stderr)
                return 1
        finally:
            if watch.poll() is None:
                watch.kill()
    latencies.sort()
    print(f"\n{args.files} dumps, poll interval {args.poll_interval} s, "
          f"{'marker' if args.marker else 'stable size across two polls'}: median "
          f"{statistics.median(latencies):.3f} s, min {latencies[0]:.3f} s, max {latencies[-1]:.3f} s, "
          f"p90 {latencies[int(0.9 * (len(latencies) - 1))]:.3f} s")
    return 0


def land(dump: Path, folder: Path, marker: bool) -> float:
    temp = folder / f".{dump.name}"
    temp.write_bytes(dump.read_bytes())
    os.replace(temp, folder / dump.name)
    landed = time.monotonic()
    if marker:
        (folder / f"{dump.name}.done").touch()
    return landed


def wait_visible(path: Path, watch: subprocess.Popen, timeout: float = 120.0) -> float:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if watch.poll() is not None:
            raise RuntimeError(f"watch exited {watch.returncode}: {watch.stderr.read()[-3000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path.name} not visible after {timeout} s")
        time.sleep(0.005)
    return time.monotonic()


if __name__ == "__main__":
    sys.exit(main())
