-- Tokens with a NaN or infinite log-prob on either side (or in lp_diff). The drift views leave
-- them out of every statistic (drift_steps.nonfinite_tokens counts the covered ones); the
-- reference reader would turn its whole step aggregate into NaN.
-- Severity: error
-- Grain: one row per offending token (run, rollout_id, evaluation, batch_position, position).
-- Rule: any of train_log_prob, rollout_log_prob, lp_diff is non-null and not finite, whatever
-- the mask (train and eval rows). Parameters: none.
-- Inputs: audit_tokens (the candidate token rows of each step, in the tokens' types).
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
    lp_diff
FROM audit_tokens
WHERE NOT ISFINITE(train_log_prob)
    OR NOT ISFINITE(rollout_log_prob)
    OR NOT ISFINITE(lp_diff)
ORDER BY run, rollout_id, evaluation, batch_position, position
