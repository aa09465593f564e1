-- Drift by the weight version that generated each token: do tokens from older weights drift more?
-- Grain: one row per (run, rollout_id, token_version, token_staleness) with at least one covered
--        finite token; null keys group the tokens whose version is unknown (outside every
--        weight-version span, or a legacy list whose calls cannot be placed).
-- Inputs: drift_tokens; macro drift_breakdown (sql/macros).
-- Columns:
--   run, rollout_id          keys
--   token_version   VARCHAR  tokens.token_version: the version that generated the token
--   token_staleness BIGINT   tokens.token_staleness = rollout_id - token_version (steps)
--   tokens          BIGINT   covered finite tokens
--   samples         BIGINT   samples with a covered finite token
--   mean_lp_diff    DOUBLE   mean delta (nats)
--   mean_abs_lp_diff DOUBLE  mean |delta| (nats, token mean)
--   max_abs_lp_diff DOUBLE   max |delta| (nats)
--   k3_kl           DOUBLE   mean of r - 1 - delta (nats)
--   k3_share        DOUBLE   the group's k3 sum / the step's k3 sum (fraction)
--   mult_prob_error DOUBLE   mean exp(|delta|) (ratio)
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
SELECT
    run::VARCHAR AS run,  -- run name
    rollout_id::BIGINT AS rollout_id,  -- training step
    token_version::VARCHAR AS token_version,  -- weight version that generated the token
    token_staleness::BIGINT AS token_staleness,  -- steps
    tokens::BIGINT AS tokens,  -- covered finite tokens
    samples::BIGINT AS samples,  -- samples
    mean_lp_diff::DOUBLE AS mean_lp_diff,  -- nats
    mean_abs_lp_diff::DOUBLE AS mean_abs_lp_diff,  -- nats
    max_abs_lp_diff::DOUBLE AS max_abs_lp_diff,  -- nats
    k3_kl::DOUBLE AS k3_kl,  -- nats
    step_share(k3_sum, run, rollout_id, share_scope)::DOUBLE AS k3_share,  -- fraction of the step's k3 sum
    mult_prob_error::DOUBLE AS mult_prob_error  -- ratio
FROM grouped
ORDER BY run, rollout_id, token_staleness, token_version
