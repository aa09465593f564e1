-- Loss-covered training tokens whose |lp_diff| is at least abs_lp_diff_limit nats. Usual
-- causes: a misaligned token, a wrong mask, or a broken weight sync.
-- Severity: error
-- Grain: one row per offending token (run, rollout_id, batch_position, position).
-- Rule: not evaluation, loss_mask > 0, lp_diff finite, |lp_diff| >= abs_lp_diff_limit.
-- Parameters (drift_settings): abs_lp_diff_limit (20 nats).
-- Inputs: audit_tokens, tokens, drift_settings; macro large_lp_diff_floor (sql/macros).
-- audit_tokens (the rollup audit_token_rows) holds every token at or above
-- large_lp_diff_floor() (5 nats); a limit below that reads the tokens (a guarded fallback,
-- skipped otherwise).
WITH candidates AS (
    SELECT audit_tokens.*
    FROM audit_tokens
    JOIN drift_settings AS s ON s.abs_lp_diff_limit >= large_lp_diff_floor()
    UNION ALL
    SELECT live.* EXCLUDE (hit)
    FROM (
        SELECT
            run,
            rollout_id,
            evaluation,
            batch_position,
            sample_index,
            position,
            token_id,
            loss_mask,
            train_log_prob,
            rollout_log_prob,
            lp_diff,
            1 AS hit
        FROM tokens
    ) AS live
    JOIN (
        SELECT 1 AS hit
        FROM drift_settings
        WHERE NOT COALESCE(abs_lp_diff_limit >= large_lp_diff_floor(), false)
    ) AS g USING (hit)
)
SELECT
    t.run,
    t.rollout_id,
    t.batch_position,
    t.sample_index,
    t.position,
    t.token_id,
    t.train_log_prob,
    t.rollout_log_prob,
    t.lp_diff,
    s.abs_lp_diff_limit
FROM candidates AS t
CROSS JOIN drift_settings AS s
WHERE NOT t.evaluation
    AND t.loss_mask > 0
    AND ISFINITE(t.lp_diff)
    AND ABS(t.lp_diff) >= s.abs_lp_diff_limit
ORDER BY t.run, t.rollout_id, t.batch_position, t.position
