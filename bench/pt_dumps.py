"""`python -m bench.pt_dumps`: sizes P and P-miles, slime and miles `.pt` dumps, against their floors.

    python -m bench.pt_dumps [--scale 1.0] [--rounds 3] [--sizes P,P-miles] [--skip-check]

Data (bench/data/<size>-<scale>/, generated once with pipeline/generate.py's write_pt_run): 8 dumps,
`Sample.to_dict()` layout, 128 prompts x 8 rollouts a step (the generator's fan-out makes ~1.6 rows a
rollout), responses of `--scale` x 1,650 tokens on average (log-normal), tokens, loss_mask and
rollout_log_probs as Python lists: ~42 MB a dump at scale 1. P: slime dumps; P-miles: miles dumps
(with metadata.prompt_group_sizes).

Implementations, each a fresh process, interleaved rounds:
- pipeline: `relabel run --semantics group-index`.
- safe floor: torch.load(weights_only=True) + group-index GRPO + pa.Table.from_pylist + Parquet,
  one process (bench/peers/pt_floor.py).
- unsafe floor: the same with weights_only=False (the C unpickler), one process.
- unsafe floor on two processes: the dumps split over two processes.
Check first: every floor's advantages equal the pipeline's (1e-5), row for row.
Peak RSS is the largest sum, over the run, of the resident memory of the process and all its
descendants, sampled every 20 ms (the pipeline's pool processes and the floor's two processes count
together); ru_maxrss would give only the largest single process.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from bench.harness import OUT_DIR, ROOT, fresh_dir, relabel_command

DATA_DIR = os.path.join(ROOT, "bench", "data")
FILES = 8
PROMPTS, SAMPLES, MEAN_TOKENS = 128, 8, 1650
FLAVORS = {"P": "slime", "P-miles": "miles"}
PEERS = {
    "pipeline": ("pipeline (relabel run)", None),
    "safe": ("safe floor: weights_only=True, 1 process", ["--processes", "1"]),
    "unsafe": ("unsafe floor: weights_only=False, 1 process", ["--unsafe", "--processes", "1"]),
    "unsafe2": ("unsafe floor, 2 processes", ["--unsafe", "--processes", "2"]),
}


def dataset(size: str, scale: float, log=print) -> str:
    from rollout_relabel.pipeline.generate import RunSpec, write_pt_run

    spec = RunSpec(steps=FILES, prompts_per_step=PROMPTS, samples_per_prompt=SAMPLES,
                   mean_response_tokens=max(1.0, MEAN_TOKENS * scale), seed=25)
    path = os.path.join(DATA_DIR, f"{size}-{scale:g}")
    stamp = os.path.join(path, "_spec.json")
    wanted = {"spec": repr(spec), "flavor": FLAVORS[size]}
    if os.path.exists(stamp) and json.load(open(stamp)) == wanted:
        return path
    log(f"[data] generating {size} at scale {scale:g} into {path} ...")
    fresh_dir(path)
    write_pt_run(spec, path, flavor=FLAVORS[size])
    with open(stamp, "w") as handle:
        json.dump(wanted, handle)
    return path


def command(peer: str, input_dir: str, output_dir: str) -> list[str]:
    if peer == "pipeline":
        return relabel_command() + ["run", "--input", input_dir, "--output", output_dir, "--semantics", "group-index"]
    return [sys.executable, "-m", "bench.peers.pt_floor", "--input", input_dir, "--output", output_dir,
            *PEERS[peer][1]]


def measure(cmd: list[str], log_path: str) -> dict:
    """Wall time, and the peak of the summed RSS of the process tree (sampled)."""
    import psutil

    with open(log_path, "wb") as log:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        root, peak = psutil.Process(proc.pid), 0
        while proc.poll() is None:
            total = 0
            try:
                for member in [root, *root.children(recursive=True)]:
                    try:
                        total += member.memory_info().rss
                    except psutil.Error:
                        pass
            except psutil.Error:
                pass
            peak = max(peak, total)
            time.sleep(0.02)
        wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}); see {log_path}")
    return {"wall_s": wall, "peak_rss_mb": peak / 2 ** 20}


def check(outputs: dict[str, str]) -> None:
    """Every floor's advantages are the pipeline's, file by file, row by row."""
    import numpy as np
    import pyarrow.parquet as pq

    reference = outputs["pipeline"]
    names = sorted(n for n in os.listdir(reference) if n.endswith(".parquet"))
    for peer, directory in outputs.items():
        assert sorted(n for n in os.listdir(directory) if n.endswith(".parquet")) == names, peer
        for name in names:
            ours = pq.read_table(os.path.join(reference, name), columns=["advantage"]).column(0).to_numpy()
            theirs = pq.read_table(os.path.join(directory, name), columns=["advantage"]).column(0).to_numpy()
            if len(ours) != len(theirs) or not np.allclose(ours, theirs, rtol=0, atol=1e-5):
                raise SystemExit(f"check failed: {peer} {name}: advantages differ from the pipeline's")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pt_dumps", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="response length factor (1: ~42 MB a dump)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", default="P,P-miles")
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--skip-check", action="store_true")
    args = parser.parse_args(argv)
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    results, logs = {}, os.path.join(OUT_DIR, "logs")
    os.makedirs(logs, exist_ok=True)
    load_before = os.getloadavg()
    for size in sizes:
        input_dir = dataset(size, args.scale)
        megabytes = sum(os.path.getsize(os.path.join(input_dir, n)) for n in os.listdir(input_dir)
                        if n.endswith(".pt")) / 1e6
        runs = {peer: [] for peer in peers}
        if not args.skip_check:
            outputs = {}
            for peer in peers:
                outputs[peer] = fresh_dir(os.path.join(OUT_DIR, "runs", size, peer))
                subprocess.run(command(peer, input_dir, outputs[peer]), cwd=ROOT, check=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            check(outputs)
            print(f"[check] {size}: every floor's advantages equal the pipeline's", flush=True)
        for round_ in range(args.rounds):
            for peer in peers:
                out = fresh_dir(os.path.join(OUT_DIR, "runs", size, peer))
                runs[peer].append(measure(command(peer, input_dir, out), os.path.join(logs, f"{size}-{peer}.log")))
                print(f"[{size} round {round_ + 1}] {peer}: {runs[peer][-1]['wall_s']:.2f} s, "
                      f"{runs[peer][-1]['peak_rss_mb']:.0f} MB", flush=True)
        results[size] = {"megabytes": megabytes, "runs": runs}
    report = render(results, args, load_before, os.getloadavg())
    print(report)
    with open(os.path.join(OUT_DIR, "pt_report.md"), "w") as handle:
        handle.write(report)
    with open(os.path.join(OUT_DIR, "pt_results.json"), "w") as handle:
        json.dump(results, handle, indent=1)
    return 0


def render(results, args, load_before, load_after) -> str:
    lines = [f"scale {args.scale:g}, {args.rounds} round(s), load average {load_before[0]:.1f} -> "
             f"{load_after[0]:.1f}, {os.cpu_count()} cores", ""]
    for size, result in results.items():
        runs = result["runs"]
        wall = {p: statistics.median(r["wall_s"] for r in rs) for p, rs in runs.items()}
        rss = {p: statistics.median(r["peak_rss_mb"] for r in rs) for p, rs in runs.items()}
        lines += [f"### {size}: {FILES} dumps, {result['megabytes']:.0f} MB", "",
                  "| implementation | wall (median) | peak RSS, summed | pipeline / this (wall) | "
                  "pipeline / this (RSS) |", "|---|---:|---:|---:|---:|"]
        for peer in runs:
            ratio = f"{wall['pipeline'] / wall[peer]:.2f}x" if "pipeline" in wall else ""
            ratio_rss = f"{rss['pipeline'] / rss[peer]:.2f}x" if "pipeline" in rss else ""
            lines.append(f"| {PEERS[peer][0]} | {wall[peer]:.2f} s | {rss[peer]:.0f} MB | {ratio} | {ratio_rss} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
