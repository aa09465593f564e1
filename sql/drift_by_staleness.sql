-- Drift by weight-version lag: do stale or mixed-version samples drift more?
-- Grain: one row per (run, rollout_id, staleness, mixed_version) with at least one covered
--        finite token; null keys group samples whose versions are unknown.
-- Inputs: drift_sample_parts (the per-sample rollup: each sample's token count and sums, so no
--         pass over the tokens), samples; macros drift_totals, drift_statistics
--         (sql/macros). A sample without a row in `samples` keeps its tokens, with null keys.
-- Columns:
--   run              VARCHAR  run name
--   rollout_id       BIGINT   training step
--   staleness        BIGINT   samples.staleness = rollout_id - weight_version_min (steps; the
--                             reference formula, see dump-format.md section 10 for its offset)
--   mixed_version    BOOLEAN  samples.mixed_version: the engine changed weights mid-sample
--   + the columns of macro drift_statistics (sql/macros/drift_breakdown.sql): tokens,
--     samples, mean_lp_diff, mean_abs_lp_diff, max_abs_lp_diff, k3_kl, k3_share (within the
--     step), mult_prob_error
CREATE OR REPLACE VIEW drift_by_staleness AS
WITH keyed AS (
    SELECT
        p.run,
        p.rollout_id,
        '' AS share_scope,
        s.staleness,
        s.mixed_version,
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
SELECT * REPLACE (staleness::BIGINT AS staleness, mixed_version::BOOLEAN AS mixed_version)
FROM drift_statistics(grouped)
ORDER BY run, rollout_id, staleness, mixed_version
