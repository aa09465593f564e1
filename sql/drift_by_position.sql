-- Drift by response position: does the mismatch grow along the response?
-- Grain: one row per (run, rollout_id, position_bucket) with at least one covered finite token.
-- Buckets are log2-spaced: bucket b holds response positions [2^b - 1, 2^(b+1) - 2], i.e.
--   0: {0}, 1: {1, 2}, 2: {3..6}, 3: {7..14}, ...
-- Inputs: drift_tokens; macros drift_breakdown, drift_statistics, log2_bucket (sql/macros).
-- Columns:
--   run              VARCHAR  run name
--   rollout_id       BIGINT   training step
--   position_bucket  INTEGER  b = floor(log2(position + 1))
--   position_low     INTEGER  first response position of the bucket (0-based)
--   position_high    INTEGER  last response position of the bucket (inclusive)
--   + the columns of macro drift_statistics (sql/macros/drift_breakdown.sql): tokens,
--     samples, mean_lp_diff, mean_abs_lp_diff, max_abs_lp_diff, k3_kl, k3_share (within the
--     step), mult_prob_error
CREATE OR REPLACE VIEW drift_by_position AS
WITH keyed AS (
    SELECT
        run,
        rollout_id,
        batch_position,
        '' AS share_scope,
        log2_bucket(position + 1) AS position_bucket,
        lp_diff,
        abs_lp_diff,
        k3
    FROM drift_tokens
),
grouped AS MATERIALIZED (
    SELECT * FROM drift_breakdown(keyed)
)
SELECT
    run,
    rollout_id,
    position_bucket::INTEGER AS position_bucket,
    (2 ** position_bucket - 1)::INTEGER AS position_low,
    (2 ** (position_bucket + 1) - 2)::INTEGER AS position_high,
    * EXCLUDE (run, rollout_id, position_bucket)  -- the statistics, in drift_statistics' order
FROM drift_statistics(grouped)
ORDER BY run, rollout_id, position_bucket
