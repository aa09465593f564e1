-- Loss-covered training tokens whose |lp_diff| is at least abs_lp_diff_limit nats. Usual
-- causes: a misaligned token, a wrong mask, or a broken weight sync.
-- Severity: error
-- Grain: one row per offending token (run, rollout_id, batch_position, position).
-- Rule: not evaluation, loss_mask > 0, lp_diff finite, |lp_diff| >= abs_lp_diff_limit.
-- Parameters (drift_settings): abs_lp_diff_limit (20 nats).
-- Inputs: tokens, drift_settings.
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
FROM tokens AS t
CROSS JOIN drift_settings AS s
WHERE NOT t.evaluation
    AND t.loss_mask > 0
    AND ISFINITE(t.lp_diff)
    AND ABS(t.lp_diff) >= s.abs_lp_diff_limit
ORDER BY t.run, t.rollout_id, t.batch_position, t.position
