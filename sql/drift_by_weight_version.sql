-- Drift by the weight version that generated each token: do tokens from older weights drift more?
-- Grain: one row per (run, rollout_id, token_version, token_staleness) with at least one covered
--        finite token; null keys group the tokens whose version is unknown (outside every
--        weight-version span, or a legacy list whose calls cannot be placed).
-- Inputs: drift_tokens; macros drift_breakdown, drift_statistics (sql/macros).
-- Columns:
--   run              VARCHAR  run name
--   rollout_id       BIGINT   training step
--   token_version    VARCHAR  tokens.token_version: the version that generated the token
--   token_staleness  BIGINT   tokens.token_staleness = rollout_id - token_version (steps)
--   + the columns of macro drift_statistics (sql/macros/drift_breakdown.sql): tokens,
--     samples, mean_lp_diff, mean_abs_lp_diff, max_abs_lp_diff, k3_kl, k3_share (within the
--     step), mult_prob_error
CREATE OR REPLACE VIEW drift_by_weight_version AS
WITH keyed AS (
    SELECT
        run,
        rollout_id,
        batch_position,
        '' AS share_scope,
        token_version,
        token_staleness,
        lp_diff,
        abs_lp_diff,
        k3
    FROM drift_tokens
),
grouped AS MATERIALIZED (
    SELECT * FROM drift_breakdown(keyed)
)
SELECT * REPLACE (
    token_version::VARCHAR AS token_version, token_staleness::BIGINT AS token_staleness
)
FROM drift_statistics(grouped)
ORDER BY run, rollout_id, token_staleness, token_version
