"""Shared by the peers: CLI, input listing, output naming, the floor's Parquet writer options.

Kept free of heavy imports (no Beam, no project modules) so a peer's process
pays only for the libraries it really uses.
"""
from __future__ import annotations

import argparse
import os

PARQUET_SUFFIXES = (".parquet", ".pq")

# The columns every peer adds, in the order the pipeline writes them (loss_mask is replaced in place).
ADDED = ("raw_reward", "advantage", "mainstream", "rollout_key", "prompt_group", "truncated", "rollout_mask_sum")
STD_EPS = 1e-6


def parse_args(description: str):
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--input", required=True, help="directory of Parquet rollout files")
    parser.add_argument("--output", required=True, help="output directory (one file per input file)")
    args = parser.parse_args()
    os.makedirs(args.output, exist_ok=True)
    return args


def input_files(directory: str) -> list[str]:
    """Parquet files under `directory`, in sorted path order (= the pipeline's row order)."""
    found = []
    for root, _, names in os.walk(directory):
        found += [os.path.join(root, n) for n in names if n.lower().endswith(PARQUET_SUFFIXES)]
    return sorted(found)


def output_path(output_dir: str, input_path: str, input_dir: str) -> str:
    """part-<stem>.parquet, the stem relative to the input root, as the pipeline names it."""
    rel = os.path.relpath(input_path, input_dir)
    stem = "__".join(p for p in os.path.splitext(rel)[0].split(os.sep) if p not in ("", ".", ".."))
    return os.path.join(output_dir, f"part-{stem}.parquet")


def parquet_write_options(schema) -> dict:
    """Replica of output_files.parquet_write_options (the harness checks they agree):
    zstd, dictionary encoding only for non-list columns. Replicated so that peers do not import Beam."""
    import pyarrow as pa

    flat = [f.name for f in schema if not (pa.types.is_list(f.type) or pa.types.is_large_list(f.type))]
    return {"compression": "zstd", "use_dictionary": flat, "write_statistics": True}
