-- Drift by response length: do long responses drift more?
-- Grain: one row per (run, rollout_id, length_bucket) with at least one covered finite token.
-- Buckets are log2-spaced on samples.response_length R: bucket b holds R in
--   [2^b, 2^(b+1) - 1], i.e. 0: {1}, 1: {2, 3}, 2: {4..7}, ...; null when R is unknown.
-- Inputs: drift_sample_terms (each sample's sums from the per-sample rollup, beside its
--         properties: no pass over the tokens); macros drift_totals, drift_statistics, log2_bucket
--         (sql/macros). A sample without a row in `samples` keeps its tokens, with null keys.
-- Columns:
--   run              VARCHAR  run name
--   rollout_id       BIGINT   training step
--   length_bucket    INTEGER  floor(log2(response_length))
--   length_low       INTEGER  shortest response length of the bucket (tokens)
--   length_high      INTEGER  longest response length of the bucket (tokens, inclusive)
--   + the columns of macro drift_statistics (sql/macros/drift_breakdown.sql): tokens,
--     samples, mean_lp_diff, mean_abs_lp_diff, max_abs_lp_diff, k3_kl, k3_share (within the
--     step), mult_prob_error
CREATE OR REPLACE VIEW drift_by_length AS
WITH keyed AS (
    SELECT
        run,
        rollout_id,
        '' AS share_scope,
        log2_bucket(response_length) AS length_bucket,
        * EXCLUDE (run, rollout_id, batch_position, response_length, dumped_rank, staleness, mixed_version)
    FROM drift_sample_terms
),
grouped AS MATERIALIZED (
    SELECT * FROM drift_totals(keyed)
)
SELECT
    run,
    rollout_id,
    length_bucket::INTEGER AS length_bucket,
    (2 ** length_bucket)::INTEGER AS length_low,
    (2 ** (length_bucket + 1) - 1)::INTEGER AS length_high,
    * EXCLUDE (run, rollout_id, length_bucket)  -- the statistics, in drift_statistics' order
FROM drift_statistics(grouped)
ORDER BY run, rollout_id, length_bucket
