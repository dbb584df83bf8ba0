"""`python -m bench`: the pipeline against its peers on the same generated data.

    python -m bench [--sizes S,M,M2,T,T1] [--rounds 3] [--skip-check] [--markdown FILE]
                    [--peers pipeline,duckdb,polars,loop,floor,floor2] [--skip-startup] [--skip-micro]
                    [--skip-watch]

1. Datasets (bench/data/<size>/, generated once, reused while the spec stamp matches).
2. Check (unless --skip-check): every peer's output equals the pipeline's on every
   dataset (advantage within 1e-5, every other column identical); a mismatch aborts.
3. Timed rounds, interleaved (A B C D E, A B C D E, ...), each run a fresh process
   measured from its parent, a small launcher process (perf_counter wall, os.wait4 rusage
   peak RSS and CPU; see bench/launcher.py).
4. Start-up cost of the pipeline and the numeric core's throughput.
   `relabel watch` over a backlog of 1,000 files against `relabel run` on them (bench/watch_backlog.py;
   target: within 2x).
5. Report: printed, and written as markdown to bench/out/report.md (and --markdown FILE).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

import pyarrow.parquet as pq

from bench import datasets as ds_lib
from bench import first_group, watch_backlog
from bench.harness import (
    ALIASES,
    IMPLS,
    LOG_DIR,
    ONLY_WHEN_NAMED,
    OUT_DIR,
    ROOT,
    RUNS_DIR,
    RunFailed,
    fresh_dir,
    measure,
    relabel_command,
    run_impl,
)

DEFAULT_SIZES = "S,M,M2,T,T1"
NOT_ON_L_BY_DEFAULT = ("loop_peer",)  # ~1 KB of Python objects per row: ~10 GB on L; ask with --peers


def log(message: str) -> None:
    print(message, flush=True)


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help=f"comma-separated of {','.join(ds_lib.DATASETS)} "
                        f"(default {DEFAULT_SIZES}; L only when asked)")
    parser.add_argument("--rounds", type=int, default=3, help="timed runs of each implementation per dataset")
    parser.add_argument("--skip-check", action="store_true", help="do not check the peers' output first")
    parser.add_argument("--markdown", help="also write the markdown report to this file")
    parser.add_argument("--peers", default=None,
                        help="implementations to run, comma-separated of " + ",".join(ALIASES)
                        + " (default all but dask; on L the python loop only when named; dask: the pipeline "
                        "on Beam's Dask runner, a LocalCluster, needs the dask extra)")
    parser.add_argument("--skip-startup", action="store_true", help="do not measure the pipeline's start-up cost")
    parser.add_argument("--skip-micro", action="store_true", help="do not run the numeric-core micro-benchmark")
    parser.add_argument("--skip-watch", action="store_true", help="do not time relabel watch over a backlog")
    args = parser.parse_args(argv)
    args.sizes = [s.strip().upper() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in args.sizes if s not in ds_lib.DATASETS]
    if unknown or not args.sizes:
        parser.error(f"--sizes: unknown {unknown}; choose from {','.join(ds_lib.DATASETS)}")
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    if args.peers is None:
        args.impls, args.impls_explicit = [k for k in IMPLS if k not in ONLY_WHEN_NAMED], False
    else:
        names = [p.strip() for p in args.peers.split(",") if p.strip()]
        bad = [p for p in names if p not in ALIASES and p not in IMPLS]
        if bad:
            parser.error(f"--peers: unknown {bad}; choose from {','.join(ALIASES)}")
        wanted = {ALIASES.get(p, p) for p in names} | {"pipeline"}  # everything is compared to the pipeline
        args.impls, args.impls_explicit = [k for k in IMPLS if k in wanted], True
    return args


def impls_for(args, size: str) -> list[str]:
    if size == "L" and not args.impls_explicit:
        return [k for k in args.impls if k not in NOT_ON_L_BY_DEFAULT]
    return args.impls


def count_rows(directory: str) -> int:
    return sum(pq.ParquetFile(p).metadata.num_rows for p in ds_lib.input_files(directory))


# ------------------------------------------------------------------ check

def check_writer_options(directory: str) -> None:
    """The floor and loop peer replicate output_files.parquet_write_options (to avoid importing Beam)."""
    import logging
    logging.getLogger().setLevel(logging.ERROR)  # Beam's import-time warnings
    from bench.peers.common import parquet_write_options as replica
    from rollout_relabel.transforms.lib.output.output_files import parquet_write_options as pipeline_options

    for name in os.listdir(directory):
        if name.startswith("part-"):
            schema = pq.read_schema(os.path.join(directory, name))
            if replica(schema) != pipeline_options(schema):
                raise SystemExit(f"bench/peers/common.parquet_write_options {replica(schema)} no longer matches "
                                 f"output_files.parquet_write_options {pipeline_options(schema)}: "
                                 "update the replica")
            return


def check(size: str, input_dir: str, impls: list[str]) -> None:
    from bench.check import compare_dirs

    log(f"[check {size}] running the pipeline ...")
    m, pipeline_out, _ = run_impl(IMPLS["pipeline"], size, input_dir, "check")
    log(f"[check {size}] pipeline done in {m.wall_s:.1f}s")
    check_writer_options(pipeline_out)
    failures = []
    for key in impls:
        impl = IMPLS[key]
        if impl.kind == "pipeline" and key != "pipeline":  # the pipeline on another runner: the same bytes
            m, out, _ = run_impl(impl, size, input_dir, "check")
            problems = [f"{impl.label}: {name} differs from the in-process run's"
                        for name in sorted(set(os.listdir(pipeline_out)) | set(os.listdir(out)))
                        if not _same_file(os.path.join(pipeline_out, name), os.path.join(out, name))]
            log(f"[check {size}] {impl.label}: {m.wall_s:.1f}s, "
                + ("every file byte-identical to the in-process run's" if not problems
                   else f"{len(problems)} MISMATCH(ES)"))
            failures += problems
            continue
        if impl.kind != "peer":
            continue
        m, out, _ = run_impl(impl, size, input_dir, "check")
        problems = compare_dirs(pipeline_out, out, impl.label)
        log(f"[check {size}] {impl.label}: {m.wall_s:.1f}s, "
            + ("output equals the pipeline's" if not problems else f"{len(problems)} MISMATCH(ES)"))
        failures += problems
    if failures:
        log("\nCHECK FAILED: a peer's output differs from the pipeline's; no time was counted.")
        for p in failures:
            log("  - " + p)
        log(f"(outputs kept under {os.path.join(RUNS_DIR, size)})")
        raise SystemExit(1)


def _same_file(a: str, b: str) -> bool:
    if not (os.path.isfile(a) and os.path.isfile(b)):
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read() == fb.read()


# ------------------------------------------------------------------ timed rounds

def timed(size: str, input_dir: str, impls: list[str], rounds: int) -> dict:
    runs = {k: [] for k in impls}
    for r in range(1, rounds + 1):
        for key in impls:
            m, _, size_bytes = run_impl(IMPLS[key], size, input_dir, f"r{r}")
            runs[key].append({"wall_s": m.wall_s, "cpu_s": m.cpu_s, "peak_rss_mb": m.peak_rss_mb,
                              "output_bytes": size_bytes})
            log(f"[{size} round {r}/{rounds}] {IMPLS[key].label:<24} {m.wall_s:7.2f}s wall "
                f"{m.cpu_s:7.2f}s cpu {m.peak_rss_mb:7.0f} MB peak")
    return runs


# ------------------------------------------------------------------ start-up and core

FIRST_GROUP = "relabel run on M: its first file group starts"


def startup(input_dir: str, first_group_dir: str, repeat: int = 5) -> dict:
    """Start-up, each figure a fresh process: the interpreter, Beam's own import, ours, a dry run, and the
    time from starting `relabel run` on M to its first file group starting (bench/first_group.py)."""
    tmp_out = os.path.join(RUNS_DIR, "dry-run")
    probe = os.path.join(RUNS_DIR, "first-group.txt")
    commands = {
        "python -c pass (interpreter)": [sys.executable, "-c", "pass"],
        "python -c 'import apache_beam' (Beam's own import)": [sys.executable, "-c", "import apache_beam"],
        "python -c 'import rollout_relabel.pipeline.run'": [sys.executable, "-c",
                                                            "import rollout_relabel.pipeline.run"],
        "relabel run --dry-run (S inputs)": relabel_command() + ["run", "--dry-run", "--input", input_dir,
                                                               "--output", tmp_out],
        FIRST_GROUP: [sys.executable, "-m", "bench.first_group", "run", "--input", first_group_dir,
                      "--output", tmp_out],
    }
    results = {k: [] for k in commands}
    for _ in range(repeat):
        for label, command in commands.items():
            fresh_dir(tmp_out)
            if os.path.exists(probe):
                os.remove(probe)
            m = measure(command, os.path.join(LOG_DIR, f"startup-{len(results[label])}.log"),
                        env={first_group.ENV: probe})
            if m.exit_code != 0:
                raise RunFailed(f"{label} exited with {m.exit_code}; log {m.log}")
            wall = m.wall_s
            if label == FIRST_GROUP:
                with open(probe) as f:
                    wall = float(f.read()) - m.started_at
            results[label].append({"wall_s": wall, "cpu_s": m.cpu_s, "peak_rss_mb": m.peak_rss_mb})
    shutil.rmtree(tmp_out, ignore_errors=True)
    log("[startup] " + ", ".join(f"{k}: {statistics.median(r['wall_s'] for r in v):.2f}s"
                                 for k, v in results.items()))
    return results


def core_micro(input_dir: str) -> dict:
    log("[core] micro-benchmark of core.advantages.relabel ...")
    path = os.path.join(LOG_DIR, "core-micro.log")
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-m", "bench.core_micro", input_dir, "--repeat", "10"], cwd=ROOT,
                          env=env, capture_output=True, text=True)
    with open(path, "w") as f:
        f.write(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RunFailed(f"core micro-benchmark failed ({proc.returncode}); log {path}:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    log("[core] " + "; ".join(f"{name}: best {r['best_s']:.3f}s = {r['rows_per_s'] / 1e6:.2f} M rows/s"
                             for name, r in result["by_backend"].items()))
    return result


# ------------------------------------------------------------------ report

def _median(values):
    return statistics.median(values)


def dataset_table(size: str, rows: int, runs: dict) -> tuple[list[str], list[list[str]], list[str]]:
    med = {k: _median(r["wall_s"] for r in v) for k, v in runs.items()}
    floor = med.get("floor")
    floor2 = med.get("floor_2core")
    pipeline = med.get("pipeline")
    floor_size = runs["floor"][-1]["output_bytes"] if "floor" in runs else None
    header = ["implementation", "wall median s", "min–max s", "cpu median s", "peak RSS MB", "rows/s",
              "× floor", "× 2-core floor", "pipeline ÷ this", "output MB", "size × floor"]
    table = []
    for key, v in runs.items():
        walls = [r["wall_s"] for r in v]
        out_bytes = v[-1]["output_bytes"]
        table.append([
            IMPLS[key].label,
            f"{med[key]:.2f}",
            f"{min(walls):.2f}–{max(walls):.2f}",
            f"{_median(r['cpu_s'] for r in v):.2f}",
            f"{max(r['peak_rss_mb'] for r in v):.0f}",
            f"{rows / med[key]:,.0f}",
            f"{med[key] / floor:.2f}" if floor else "–",
            f"{med[key] / floor2:.2f}" if floor2 else "–",
            f"{pipeline / med[key]:.2f}" if pipeline else "–",
            f"{out_bytes / 1e6:.1f}",
            f"{out_bytes / floor_size:.2f}" if floor_size else "–",
        ])
    notes = []
    if "pipeline" in runs:
        for key in runs:
            if key == "pipeline":
                continue
            per_round = [p["wall_s"] / o["wall_s"] for p, o in zip(runs["pipeline"], runs[key])]
            notes.append(f"pipeline / {IMPLS[key].label}, per round: "
                         + ", ".join(f"{x:.2f}" for x in per_round) + f" → median {_median(per_round):.2f}")
    return header, table, notes


def text_table(header, rows) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]

    def line(cells):
        return "  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def md_table(header, rows) -> str:
    rule = "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"
    out = ["| " + " | ".join(header) + " |", rule]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


CODE_PATHS = ["pipeline", "transforms", "schemas", "pyproject.toml"]


def code_version() -> tuple[str, str]:
    """(HEAD plus a digest of uncommitted changes, fingerprint of the pipeline's code only).

    Others may edit the tree during a run; the fingerprint (git tree ids of the pipeline's code
    and the digest of its uncommitted changes) tells whether the measured code changed.
    """
    def git(*args) -> bytes:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True).stdout

    try:
        head = git("rev-parse", "--short", "HEAD").decode().strip() or "?"
        trees = git("rev-parse", *[f"HEAD:{p}" for p in CODE_PATHS])
        diff = git("diff", "HEAD", "--", *CODE_PATHS)
    except OSError:
        return "?", "?"
    import hashlib
    digest = hashlib.sha1(diff).hexdigest()[:8]
    label = head + (f" + uncommitted changes {digest}" if diff else "")
    return label, hashlib.sha1(trees + diff).hexdigest()[:12]


def environment() -> dict:
    import duckdb
    import polars
    import pyarrow
    versions = {"python": platform.python_version(), "pyarrow": pyarrow.__version__, "duckdb": duckdb.__version__,
                "polars": polars.__version__}
    try:
        from importlib.metadata import version
        versions["apache-beam"] = version("apache-beam")
        versions["torch"] = version("torch")
    except Exception:  # noqa: BLE001
        pass
    commit, fingerprint = code_version()
    return {"cpus": os.cpu_count(), "machine": platform.machine(), "versions": versions, "commit": commit,
            "code_fingerprint": fingerprint}


def report(args, env, results, load_before, load_after, started, elapsed) -> str:
    md = ["# rollout-relabel benchmark", ""]
    md.append(f"{started:%Y-%m-%d %H:%M} · commit {env['commit']} · {env['cpus']} CPUs ({env['machine']}) · "
              + ", ".join(f"{k} {v}" for k, v in env["versions"].items()))
    if env.get("code_fingerprint_at_end") and env["code_fingerprint_at_end"] != env["code_fingerprint"]:
        md.append("")
        md.append(f"**Warning: the pipeline's code changed during this run** (at the end: {env['commit_at_end']}); "
                  "runs of different rounds may have used different code.")
    md.append(f"rounds {args.rounds}, interleaved; every run a fresh process measured from its parent, a small "
              "launcher "
              f"process (wall: perf_counter, peak RSS and CPU: os.wait4 rusage). Load average before "
              f"{load_before[0]:.2f} / after {load_after[0]:.2f} (other processes share this machine: compare ratios, "
              f"not seconds). Semantics rollout-mainstream, grpo, std on. "
              + ("Peers' output checked equal to the pipeline's before timing." if not args.skip_check
                 else "**Output check skipped (--skip-check).**"))
    md.append("")
    for size, data in results["datasets"].items():
        header, rows, notes = dataset_table(size, data["rows"], data["runs"])
        ds = ds_lib.DATASETS[size]
        md.append(f"## {size}: {data['rows']:,} rows, {data['files']} files, {data['input_bytes'] / 1e6:.0f} MB input "
                  f"({ds.description}; steps={ds.spec.steps}, files_per_step={ds.spec.files_per_step}, "
                  f"mean_response_tokens={ds.spec.mean_response_tokens:g})")
        md.append("")
        md.append(md_table(header, rows))
        md.append("")
        md += [f"- {n}" for n in notes]
        md.append("")
    if results.get("startup"):
        md.append("## Pipeline start-up cost")
        md.append("")
        rows = [[label, f"{_median(r['wall_s'] for r in v):.2f}", f"{min(r['wall_s'] for r in v):.2f}–"
                 f"{max(r['wall_s'] for r in v):.2f}", f"{max(r['peak_rss_mb'] for r in v):.0f}"]
                for label, v in results["startup"].items()]
        md.append(md_table(["process", "wall median s", "min–max s", "peak RSS MB"], rows))
        md.append("")
    if results.get("core"):
        c = results["core"]
        md.append("## Numeric core")
        md.append("")
        md.append(f"core.advantages.relabel on one CoreInput of {c['rows']:,} rows ({c['batches']} batches, "
                  f"dataset M, built in-process with slim.extract_slim), numpy {c['numpy']} (the "
                  f"pipeline's CPU path) and torch {c['torch']} on CPU (the GPU path's code); "
                  f"only the core call timed, best of {len(c['times_s'])} after a warm-up call:")
        md.append("")
        rows = [[name, f"{r['best_s']:.3f}", f"{r['rows_per_s']:,.0f}", ", ".join(f"{x:.3f}" for x in r["times_s"])]
                for name, r in c["by_backend"].items()]
        md.append(md_table(["backend", "best s", "rows/s", "all runs s"], rows))
        md.append("")
    if results.get("watch_backlog"):
        w = results["watch_backlog"]
        md.append("## relabel watch over a backlog")
        md.append("")
        md.append(f"{w['files']} small slime dumps present when the watch starts (bench/watch_backlog.py): "
                  f"`relabel run` {w['run_s']:.1f} s, `relabel watch --stop-after-files {w['files']}` "
                  f"{w['watch_s']:.1f} s: watch / run = {w['ratio']:.2f} (target <= {w['target']:g}: "
                  f"{'met' if w['met'] else 'NOT met'}).")
        md.append("")
    md.append(f"Total benchmark wall time {elapsed / 60:.1f} min.")
    return "\n".join(md) + "\n"


def print_tables(results) -> None:
    for size, data in results["datasets"].items():
        header, rows, notes = dataset_table(size, data["rows"], data["runs"])
        log(f"\n== {size}: {data['rows']:,} rows, {data['files']} files, {data['input_bytes'] / 1e6:.0f} MB input ==")
        log(text_table(header, rows))
        for n in notes:
            log("  " + n)


# ------------------------------------------------------------------ main

COMPILED = ("pipeline", "transforms", "schemas", "rollout_relabel", "bench")


def compile_project() -> None:
    """Byte-compile the project's modules, as installing a wheel does. An editable install leaves that to
    the first import, and where PYTHONDONTWRITEBYTECODE is set (this sandbox sets it) to every import of
    every run: start-up figures would then include compiling our own sources."""
    import compileall

    for package in COMPILED:
        compileall.compile_dir(os.path.join(ROOT, package), quiet=1)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    t_start = time.perf_counter()
    started = datetime.datetime.now()
    load_before = os.getloadavg()
    os.makedirs(OUT_DIR, exist_ok=True)
    env = environment()
    log(f"[bench] sizes {','.join(args.sizes)}, rounds {args.rounds}, implementations "
        f"{', '.join(IMPLS[k].label for k in args.impls)}; {env['cpus']} CPUs, load {load_before[0]:.2f}")

    compile_project()
    dirs = {}
    for size in args.sizes:
        dirs[size] = ds_lib.ensure(ds_lib.DATASETS[size], log=log)
    micro_dir = None
    if not args.skip_micro:
        micro_dir = ds_lib.ensure(ds_lib.DATASETS["M"], log=log)

    results = {"datasets": {}}
    try:
        if not args.skip_check:
            for size in args.sizes:
                check(size, dirs[size], impls_for(args, size))
            log("[check] every peer's output equals the pipeline's")
        for size in args.sizes:
            files = ds_lib.input_files(dirs[size])
            impls = impls_for(args, size)
            if size == "L" and impls != args.impls:
                log(f"[L] skipping {', '.join(IMPLS[k].label for k in args.impls if k not in impls)} "
                    "(name it in --peers to include it)")
            results["datasets"][size] = {
                "rows": count_rows(dirs[size]), "files": len(files),
                "input_bytes": sum(os.path.getsize(f) for f in files),
                "runs": timed(size, os.path.abspath(dirs[size]), impls, args.rounds),
            }
            shutil.rmtree(os.path.join(RUNS_DIR, size), ignore_errors=True)  # outputs measured: free the disk
        if not args.skip_startup:
            small = dirs.get("S") or ds_lib.ensure(ds_lib.DATASETS["S"], log=log)
            medium = dirs.get("M") or ds_lib.ensure(ds_lib.DATASETS["M"], log=log)
            results["startup"] = startup(os.path.abspath(small), os.path.abspath(medium))
        if micro_dir:
            results["core"] = core_micro(os.path.abspath(micro_dir))
        if not args.skip_watch:
            results["watch_backlog"] = watch_backlog.measure(1000, log=log)
    except RunFailed as error:
        log(f"\nBENCHMARK FAILED: {error}")
        return 1

    elapsed = time.perf_counter() - t_start
    env["commit_at_end"], env["code_fingerprint_at_end"] = code_version()
    print_tables(results)
    if env["code_fingerprint_at_end"] != env["code_fingerprint"]:
        log(f"\nWARNING: the pipeline's code changed during the run ({env['commit']} -> {env['commit_at_end']})")
    text = report(args, env, results, load_before, os.getloadavg(), started, elapsed)
    targets = [os.path.join(OUT_DIR, "report.md")] + ([args.markdown] if args.markdown else [])
    for path in targets:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    with open(os.path.join(OUT_DIR, "results.json"), "w") as f:
        json.dump({"args": {k: v for k, v in vars(args).items()}, "environment": env, "results": results},
                  f, indent=1, default=str)
    if results.get("startup"):
        log("\nstart-up: " + "; ".join(f"{k} {_median(r['wall_s'] for r in v):.2f}s"
                                      for k, v in results["startup"].items()))
    if results.get("core"):
        c = results["core"]
        log(f"numeric core ({c['rows']:,} rows, best of {len(c['times_s'])}): "
            + "; ".join(f"{name} {r['best_s']:.3f}s = {r['rows_per_s'] / 1e6:.2f} M rows/s"
                        for name, r in c["by_backend"].items()))
    log(f"\nreport written to {', '.join(targets)} (raw numbers: {os.path.join(OUT_DIR, 'results.json')}); "
        f"total {elapsed / 60:.1f} min")
    return 0
