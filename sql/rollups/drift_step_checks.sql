-- Per-step token counts and correlations behind the step audits mixed_sampling_support,
-- shifted_log_probs and tokens_beyond_ln2 (which apply their thresholds to these rows).
-- Grain: one row per training step (run, rollout_id) with at least one row in drift_tokens.
-- Neighbours: the next / previous drift token of the same sample by position (LEAD / LAG
--   within the sample, so within the step).
-- Inputs: drift_tokens.
-- Settings: none.
-- Columns:
--   run               VARCHAR  run name
--   rollout_id        BIGINT   training step
--   tokens            BIGINT   drift tokens with a finite lp_diff
--   beyond_ln2        BIGINT   of those, tokens with |lp_diff| > ln 2
--   bounded_tokens    BIGINT   drift tokens with support_size not null
--   unbounded_tokens  BIGINT   drift tokens with support_size null
--   pairs             BIGINT   drift tokens with a next neighbour
--   corr_same         DOUBLE   correlation of train_log_prob with rollout_log_prob
--   corr_next         DOUBLE   correlation of train_log_prob with the next one's
--                              rollout_log_prob
--   corr_previous     DOUBLE   correlation of train_log_prob with the previous one's
--                              rollout_log_prob
CREATE OR REPLACE VIEW drift_step_checks AS
WITH neighbours AS (
    SELECT
        run,
        rollout_id,
        support_size,
        lp_diff,
        train_log_prob,
        rollout_log_prob,
        LEAD(rollout_log_prob) OVER sample_order AS next_rollout_log_prob,
        LAG(rollout_log_prob) OVER sample_order AS previous_rollout_log_prob
    FROM drift_tokens
    WINDOW sample_order AS (PARTITION BY run, rollout_id, batch_position ORDER BY position)
)
SELECT
    run::VARCHAR AS run,
    rollout_id::BIGINT AS rollout_id,
    COUNT(*) FILTER (WHERE ISFINITE(lp_diff))::BIGINT AS tokens,
    COUNT(*) FILTER (WHERE ISFINITE(lp_diff) AND ABS(lp_diff) > LN(2))::BIGINT AS beyond_ln2,
    COUNT(*) FILTER (WHERE support_size IS NOT NULL)::BIGINT AS bounded_tokens,
    COUNT(*) FILTER (WHERE support_size IS NULL)::BIGINT AS unbounded_tokens,
    COUNT(next_rollout_log_prob)::BIGINT AS pairs,
    CORR(train_log_prob, rollout_log_prob)::DOUBLE AS corr_same,
    CORR(train_log_prob, next_rollout_log_prob)::DOUBLE AS corr_next,
    CORR(train_log_prob, previous_rollout_log_prob)::DOUBLE AS corr_previous
FROM neighbours
GROUP BY run, rollout_id
