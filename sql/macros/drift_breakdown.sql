-- The one aggregate block of the drift_by_* views, as a DuckDB table macro.
-- drift_breakdown(keyed): `keyed` names a relation (a CTE of the calling view) with one row per
-- covered finite token and the columns run, rollout_id, batch_position, share_scope, the
-- view's key columns, lp_diff, abs_lp_diff and k3 (from drift_tokens). Every other column is
-- a key. Returns one row per (run, rollout_id, share_scope, keys) with the statistics below.
-- One level: measured against summing per sample first and then per key, a single GROUP BY
-- with COUNT(DISTINCT batch_position) was as fast or faster (much faster for token_id, where
-- the per-sample level has nearly one row per token).
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
WITH grouped AS (
    SELECT
        * EXCLUDE (batch_position, lp_diff, abs_lp_diff, k3),
        COUNT(*) AS tokens,
        COUNT(DISTINCT batch_position) AS samples,
        AVG(lp_diff) AS mean_lp_diff,
        AVG(abs_lp_diff) AS mean_abs_lp_diff,
        MAX(abs_lp_diff) AS max_abs_lp_diff,
        AVG(k3) AS k3_kl,
        SUM(k3) AS k3_sum,
        AVG(EXP(abs_lp_diff)) AS mult_prob_error
    FROM query_table(keyed)
    GROUP BY ALL
)
SELECT
    *,
    k3_sum / NULLIF(SUM(k3_sum) OVER (PARTITION BY run, rollout_id, share_scope), 0) AS k3_share
FROM grouped;
