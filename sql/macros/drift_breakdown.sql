-- The one aggregate block of the drift_by_* views, as a DuckDB table macro.
-- drift_breakdown(keyed): `keyed` names a relation (a CTE of the calling view) with one row per
-- covered finite token and the columns run, rollout_id, batch_position, share_scope, the
-- view's key columns, lp_diff, abs_lp_diff and k3 (from drift_tokens). Every other column is
-- a key. Returns one row per (run, rollout_id, share_scope, keys) with the statistics below.
-- Two levels: tokens are first summed per sample and key, then the sample rows per key, so
-- `samples` is a row count instead of a COUNT(DISTINCT) over tokens.
-- Columns added:
--   tokens           BIGINT  covered finite tokens
--   samples          BIGINT  samples with such a token
--   mean_lp_diff     DOUBLE  mean delta (nats)
--   mean_abs_lp_diff DOUBLE  mean |delta| (nats)
--   max_abs_lp_diff  DOUBLE  max |delta| (nats)
--   k3_kl            DOUBLE  mean of r - 1 - delta (nats)
--   k3_sum           DOUBLE  sum of r - 1 - delta (nats)
--   k3_share         DOUBLE  k3_sum / the sum of k3_sum over the step's rows with the same
--                            share_scope (fraction; null when that sum is 0)
--   mult_prob_error  DOUBLE  mean exp(|delta|) (ratio)
CREATE OR REPLACE MACRO drift_breakdown(keyed) AS TABLE
WITH per_sample AS (
    SELECT
        * EXCLUDE (lp_diff, abs_lp_diff, k3),
        COUNT(*) AS n,
        SUM(lp_diff) AS sum_lp_diff,
        SUM(abs_lp_diff) AS sum_abs_lp_diff,
        MAX(abs_lp_diff) AS max_abs,
        SUM(k3) AS sum_k3,
        SUM(EXP(abs_lp_diff)) AS sum_mult_prob_error
    FROM QUERY_TABLE(keyed)
    GROUP BY ALL
),
grouped AS (
    SELECT
        * EXCLUDE (batch_position, n, sum_lp_diff, sum_abs_lp_diff, max_abs, sum_k3,
            sum_mult_prob_error),
        SUM(n) AS tokens,
        COUNT(*) AS samples,
        SUM(sum_lp_diff) / SUM(n) AS mean_lp_diff,
        SUM(sum_abs_lp_diff) / SUM(n) AS mean_abs_lp_diff,
        MAX(max_abs) AS max_abs_lp_diff,
        SUM(sum_k3) / SUM(n) AS k3_kl,
        SUM(sum_k3) AS k3_sum,
        SUM(sum_mult_prob_error) / SUM(n) AS mult_prob_error
    FROM per_sample
    GROUP BY ALL
)
SELECT
    *,
    k3_sum / NULLIF(SUM(k3_sum) OVER (PARTITION BY run, rollout_id, share_scope), 0) AS k3_share
FROM grouped;
