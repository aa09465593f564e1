-- Drift by response position: does the mismatch grow along the response?
-- Grain: one row per (run, rollout_id, position_bucket) with at least one covered finite token.
-- Buckets are log2-spaced: bucket b holds response positions [2^b - 1, 2^(b+1) - 2], i.e.
--   0: {0}, 1: {1, 2}, 2: {3..6}, 3: {7..14}, ...
-- Inputs: drift_breakdown_parts (the per-step rollup, dimension 'position'); macro
--         drift_statistics (sql/macros).
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
WITH grouped AS MATERIALIZED (
    SELECT
        run,
        rollout_id,
        '' AS share_scope,
        bucket AS position_bucket,
        * EXCLUDE (run, rollout_id, dimension, bucket, token_version, token_staleness)
    FROM drift_breakdown_parts
    WHERE dimension = 'position'
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
