"""polars peer: rollout-mainstream, grpo, std normalization on.

Pass 1 (slim): a lazy scan of the slim columns of every file computes each
row's training columns: per rollout its mainstream row (sort + unique) and mask
sum (group-by), per prompt group the statistics over rollouts (group-by),
joined back in row order. Pass 2 (heavy): per input file, read
every column, attach the results in row order, write part-<stem>.parquet
(zstd level 1, as pyarrow's default that the pipeline writes with).
"""
from __future__ import annotations

import polars as pl

from bench.peers.common import STD_EPS, input_files, output_path, parse_args

# pyarrow's default zstd level, which the pipeline and the floor write with (polars' default is 3)
ZSTD_LEVEL = 1
GROUP = ["step", "group_index"]
ROLLOUT = ["step", "group_index", "rkey_null", "rkey_or_pos"]  # a row without a key is its own rollout


def results(files: list[str]) -> pl.DataFrame:
    remove = pl.col("remove_sample").fill_null(False)
    length = pl.col("response_length").fill_null(pl.col("loss_mask").list.len()).fill_null(0).clip(lower_bound=0)
    slim = (
        pl.scan_parquet(files, row_index_name="pos")  # files in sorted path order: pos is the row order
        .select("pos", "step", "group_index", "reward",
                pl.coalesce("rollout_id", "index").alias("rollout_key"),
                pl.when(remove).then(0)
                .when(pl.col("loss_mask").is_not_null()).then(pl.col("loss_mask").list.sum())
                .otherwise(length).cast(pl.Int64).alias("trainable"))
        .with_columns(pl.col("rollout_key").is_null().alias("rkey_null"),
                      pl.coalesce("rollout_key", "pos").alias("rkey_or_pos"))
    )
    # one row per rollout: its mainstream row (most trainable tokens, ties to the earliest), mask sum, first row
    mainstream = (slim.sort(["trainable", "pos"], descending=[True, False])
                  .unique(subset=ROLLOUT, keep="first")
                  .select(*ROLLOUT, pl.col("pos").alias("mainstream_pos"), pl.col("reward").alias("unit_reward")))
    units = mainstream.join(slim.group_by(ROLLOUT).agg(pl.col("trainable").sum().alias("rollout_mask_sum"),
                                                       pl.col("pos").min().alias("first_pos")), on=ROLLOUT)
    stats = units.group_by(GROUP).agg(
        pl.len().alias("k"), pl.col("unit_reward").mean().alias("mean"), pl.col("unit_reward").std(ddof=1).alias("std"),
        pl.col("unit_reward").min().alias("lo"), pl.col("unit_reward").max().alias("hi"),
        pl.col("first_pos").min().alias("group_first"),
    ).with_columns((pl.col("group_first").rank("dense").over("step") - 1).cast(pl.Int64).alias("prompt_group"))
    units = units.join(stats, on=GROUP).select(
        *ROLLOUT, "mainstream_pos", "rollout_mask_sum", "prompt_group",
        pl.when((pl.col("k") >= 2) & (pl.col("lo") == pl.col("hi"))).then(0.0)
        .when((pl.col("k") > 1) & (pl.col("std") > 0))
        .then((pl.col("unit_reward") - pl.col("mean")) / (pl.col("std") + STD_EPS))
        .otherwise(pl.col("unit_reward") - pl.col("mean")).cast(pl.Float32).alias("advantage"))
    return (
        slim.join(units, on=ROLLOUT, how="left", maintain_order="left")
        .select(pl.col("reward").cast(pl.Float32).alias("raw_reward"),
                "advantage",
                (pl.col("pos") == pl.col("mainstream_pos")).alias("mainstream"),
                "rollout_key", "prompt_group", "rollout_mask_sum")
        .collect()
    )


def final_loss_mask() -> pl.Expr:
    """Zeros when remove_sample, ones of response_length when absent, else as stored (list<int32>)."""
    mask = pl.col("loss_mask")
    length = pl.col("response_length").fill_null(0).clip(lower_bound=0)
    ones = pl.int_ranges(0, length, dtype=pl.Int32).list.eval(pl.element() * 0 + 1)
    return (pl.when(pl.col("remove_sample").fill_null(False))
            .then(pl.when(mask.is_null()).then(ones).otherwise(mask).list.eval(pl.element() * 0))
            .when(mask.is_null()).then(ones)
            .otherwise(mask).cast(pl.List(pl.Int32)).alias("loss_mask"))


def main() -> None:
    args = parse_args(__doc__)
    files = input_files(args.input)
    computed = results(files)  # row order: each file's rows are the next table.height rows
    offset = 0
    for path in files:
        table = pl.read_parquet(path)
        added = computed.slice(offset, table.height)
        offset += table.height
        out = pl.concat([table.with_columns(final_loss_mask()), added], how="horizontal")
        out = out.with_columns(pl.col("status").eq("truncated").fill_null(False).alias("truncated"))
        out = out.select(*table.columns, "raw_reward", "advantage", "mainstream", "rollout_key", "prompt_group",
                         "truncated", "rollout_mask_sum")
        out.write_parquet(output_path(args.output, path, args.input), compression="zstd", compression_level=ZSTD_LEVEL)


if __name__ == "__main__":
    main()
