-- Loss-covered tokens whose rollout log-prob is exactly 0.0, a suspected placeholder. miles
-- writes 0.0 for tokens the engine never scored (dump-format.md 5.1); here one is trained on.
-- Severity: warning
-- Grain: one row per offending token (run, rollout_id, evaluation, batch_position, position).
-- Rule: loss_mask > 0 AND rollout_log_prob = 0.0 (train and eval rows). Parameters: none.
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
WHERE loss_mask > 0
    AND rollout_log_prob = 0.0
ORDER BY run, rollout_id, evaluation, batch_position, position
