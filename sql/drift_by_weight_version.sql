-- Drift by the weight version that generated each token: do tokens from older weights drift more?
-- Grain: one row per (run, rollout_id, token_version, token_staleness) with at least one covered
--        finite token; null keys group the tokens whose version is unknown (outside every
--        weight-version span, or a legacy list whose calls cannot be placed).
-- Inputs: drift_breakdown_parts (the per-step rollup, dimension 'weight_version'); macro
--         drift_statistics (sql/macros).
-- Columns:
--   run              VARCHAR  run name
--   rollout_id       BIGINT   training step
--   token_version    VARCHAR  tokens.token_version: the version that generated the token
--   token_staleness  BIGINT   tokens.token_staleness = rollout_id - token_version (steps)
--   + the columns of macro drift_statistics (sql/macros/drift_breakdown.sql): tokens,
--     samples, mean_lp_diff, mean_abs_lp_diff, max_abs_lp_diff, k3_kl, k3_share (within the
--     step), mult_prob_error
CREATE OR REPLACE VIEW drift_by_weight_version AS
WITH grouped AS MATERIALIZED (
    SELECT
        run,
        rollout_id,
        '' AS share_scope,
        * EXCLUDE (run, rollout_id, dimension, bucket)
    FROM drift_breakdown_parts
    WHERE dimension = 'weight_version'
)
SELECT * REPLACE (
    token_version::VARCHAR AS token_version, token_staleness::BIGINT AS token_staleness
)
FROM drift_statistics(grouped)
ORDER BY run, rollout_id, token_staleness, token_version
