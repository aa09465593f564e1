-- Drift by dumped rank (DP shard): is one trainer shard or node off?
-- Grain: one row per (run, rollout_id, dumped_rank) with at least one covered finite token.
-- Inputs: drift_sample_terms (each sample's sums from the per-sample rollup, beside its
--         properties: no pass over the tokens); macros drift_totals, drift_statistics
--         (sql/macros). A sample without a row in `samples` keeps its tokens, with null keys.
-- Columns:
--   run              VARCHAR  run name
--   rollout_id       BIGINT   training step
--   dumped_rank      BIGINT   samples.dumped_rank: lowest global rank whose train file holds
--                             the sample (one per DP shard)
--   + the columns of macro drift_statistics (sql/macros/drift_breakdown.sql): tokens,
--     samples, mean_lp_diff, mean_abs_lp_diff, max_abs_lp_diff, k3_kl, k3_share (within the
--     step), mult_prob_error
CREATE OR REPLACE VIEW drift_by_rank AS
WITH keyed AS (
    SELECT
        run,
        rollout_id,
        '' AS share_scope,
        dumped_rank,
        * EXCLUDE (run, rollout_id, batch_position, response_length, dumped_rank, staleness, mixed_version)
    FROM drift_sample_terms
),
grouped AS MATERIALIZED (
    SELECT * FROM drift_totals(keyed)
)
SELECT * REPLACE (dumped_rank::BIGINT AS dumped_rank)
FROM drift_statistics(grouped)
ORDER BY run, rollout_id, dumped_rank
