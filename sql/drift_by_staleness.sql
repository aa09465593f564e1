-- Drift by weight-version lag: do stale or mixed-version samples drift more?
-- Grain: one row per (run, rollout_id, staleness, mixed_version) with at least one covered
--        finite token; null keys group samples whose versions are unknown.
-- Inputs: drift_sample_terms (each sample's sums from the per-sample rollup, beside its
--         properties: no pass over the tokens); macros drift_totals, drift_statistics
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
        run,
        rollout_id,
        '' AS share_scope,
        staleness,
        mixed_version,
        * EXCLUDE (run, rollout_id, batch_position, response_length, dumped_rank, staleness, mixed_version)
    FROM drift_sample_terms
),
grouped AS MATERIALIZED (
    SELECT * FROM drift_totals(keyed)
)
SELECT * REPLACE (staleness::BIGINT AS staleness, mixed_version::BOOLEAN AS mixed_version)
FROM drift_statistics(grouped)
ORDER BY run, rollout_id, staleness, mixed_version
