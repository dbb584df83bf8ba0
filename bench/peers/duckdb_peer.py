"""DuckDB SQL peer: rollout-mainstream, grpo, std normalization on.

Pass 1 (slim): one query over every file computes each row's training columns
(a GROUP BY over rollouts picks the mainstream row with arg_min, a GROUP BY over
prompt groups gives the statistics over rollouts, joined back to the rows). Pass 2
(heavy): per input file, a COPY joins the results back to the file's full
rows in row order and writes part-<stem>.parquet (zstd level 1, as pyarrow's
default that the pipeline writes with; DuckDB's default level is 3).
"""
from __future__ import annotations

import duckdb

from bench.peers.common import STD_EPS, input_files, output_path, parse_args


def sql_str(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


# pos: the row's place in row order, (file ordinal in sorted path order, row in file), packed in one BIGINT.
SLIM = """
CREATE TEMP TABLE slim AS
SELECT file_row_number AS rn, step, group_index, reward,
       coalesce(rollout_id, "index") AS rkey,
       CASE WHEN coalesce(remove_sample, false) THEN 0
            WHEN loss_mask IS NOT NULL THEN coalesce(list_sum(loss_mask), 0)
            ELSE greatest(coalesce(response_length, len(loss_mask), 0), 0) END::BIGINT AS trainable,
       (list_position({files}, filename)::BIGINT << 32) + file_row_number AS pos
FROM read_parquet({files}, filename = true, file_row_number = true)
"""

RESULTS = """
CREATE TEMP TABLE results AS
WITH u AS (  -- one row per rollout: (step, group_index, rkey); a row without a key is its own rollout
    SELECT step, group_index, rkey, CASE WHEN rkey IS NULL THEN pos END AS alone,
           arg_min(pos, (-trainable, pos)) AS mainstream_pos,     -- most trainable tokens, ties to the earliest
           arg_min(reward, (-trainable, pos)) AS unit_reward,
           sum(trainable) AS rollout_mask_sum,
           min(pos) AS first_pos
    FROM slim GROUP BY ALL
),
g AS (  -- statistics over rollouts, float64; prompt_group numbered by the group's first row
    SELECT step, group_index, count(*) AS k, avg(unit_reward) AS mean, stddev_samp(unit_reward) AS std,
           min(unit_reward) AS lo, max(unit_reward) AS hi,
           dense_rank() OVER (PARTITION BY step ORDER BY min(first_pos)) - 1 AS prompt_group
    FROM u GROUP BY step, group_index
)
SELECT s.pos,
       s.reward::FLOAT AS raw_reward,
       (CASE WHEN g.k >= 2 AND g.lo = g.hi THEN 0.0
             WHEN g.k > 1 AND g.std > 0 THEN (u.unit_reward - g.mean) / (g.std + {eps})
             ELSE u.unit_reward - g.mean END)::FLOAT AS advantage,
       s.pos = u.mainstream_pos AS mainstream,
       s.rkey AS rollout_key,
       g.prompt_group::BIGINT AS prompt_group,
       u.rollout_mask_sum::BIGINT AS rollout_mask_sum
FROM slim s
JOIN u ON u.step = s.step AND u.group_index = s.group_index AND u.rkey IS NOT DISTINCT FROM s.rkey
      AND u.alone IS NOT DISTINCT FROM (CASE WHEN s.rkey IS NULL THEN s.pos END)
JOIN g ON g.step = s.step AND g.group_index = s.group_index
ORDER BY s.pos
"""

# loss_mask: zeros when remove_sample, ones of response_length when absent, else as stored.
WRITE = """
COPY (
    SELECT i.* EXCLUDE (file_row_number) REPLACE (
               CASE WHEN coalesce(i.remove_sample, false) THEN
                        list_transform(range(coalesce(len(i.loss_mask), greatest(i.response_length, 0))),
                                       lambda x: 0::INTEGER)
                    WHEN i.loss_mask IS NULL THEN
                        list_transform(range(greatest(coalesce(i.response_length, 0), 0)), lambda x: 1::INTEGER)
                    ELSE i.loss_mask::INTEGER[] END AS loss_mask),
           r.raw_reward, r.advantage, r.mainstream, r.rollout_key, r.prompt_group,
           coalesce(i.status = 'truncated', false) AS truncated,
           r.rollout_mask_sum
    FROM read_parquet({src}, file_row_number = true) AS i
    JOIN (SELECT * FROM results WHERE pos BETWEEN {lo} AND {hi}) AS r ON r.pos = {lo} + i.file_row_number
    ORDER BY i.file_row_number
) TO {dst} (FORMAT parquet, COMPRESSION zstd, COMPRESSION_LEVEL 1)
"""


def main() -> None:
    args = parse_args(__doc__)
    files = input_files(args.input)
    con = duckdb.connect()
    con.execute(SLIM.format(files="[" + ", ".join(sql_str(f) for f in files) + "]"))
    con.execute(RESULTS.format(eps=repr(STD_EPS)))
    for ordinal, path in enumerate(files, start=1):  # list_position is 1-based
        lo, hi = ordinal << 32, ((ordinal + 1) << 32) - 1
        con.execute(WRITE.format(src=sql_str(path), lo=lo, hi=hi,
                                 dst=sql_str(output_path(args.output, path, args.input))))


if __name__ == "__main__":
    main()
