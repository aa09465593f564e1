-- Drift by dumped rank (DP shard): is one trainer shard or node off?
-- Grain: one row per (run, rollout_id, dumped_rank) with at least one covered finite token.
-- Inputs: drift_sample_parts (the per-sample rollup: each sample's token count and sums, so no
--         pass over the tokens), samples; macros drift_totals, drift_statistics
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
        p.run,
        p.rollout_id,
        '' AS share_scope,
        s.dumped_rank,
        1 AS samples,
        p.tokens,
        p.sum_lp_diff AS lp_diff_sum,
        p.abs_lp_diff_sum,
        p.max_abs_lp_diff,
        p.k3_sum,
        p.exp_abs_lp_diff_sum
    FROM drift_sample_parts AS p
    LEFT JOIN samples AS s
        ON s.run = p.run
        AND s.rollout_id = p.rollout_id
        AND NOT s.evaluation
        AND s.batch_position = p.batch_position
),
grouped AS MATERIALIZED (
    SELECT * FROM drift_totals(keyed)
)
SELECT * REPLACE (dumped_rank::BIGINT AS dumped_rank)
FROM drift_statistics(grouped)
ORDER BY run, rollout_id, dumped_rank
