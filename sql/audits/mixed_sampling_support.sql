-- Training steps whose drift tokens mix a bounded sampling support with an unbounded one.
-- A log-prob over a bounded support (top-k / top-p recorded, tokens.support_size not null) is a
-- different quantity, so the step's drift statistics pool two kinds of token (group on
-- drift_tokens.support_size IS NULL to keep them apart).
-- Severity: warning
-- Grain: one row per mixing step (run, rollout_id).
-- Rule: among the step's drift_tokens, some have support_size null and some not. Parameters: none.
-- Inputs: drift_step_checks (the rollup of per-step drift-token counts).
SELECT
    run,
    rollout_id,
    bounded_tokens,
    unbounded_tokens
FROM drift_step_checks
WHERE bounded_tokens > 0
    AND unbounded_tokens > 0
ORDER BY run, rollout_id
