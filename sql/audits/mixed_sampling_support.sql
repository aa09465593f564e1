-- Training steps whose drift tokens mix a bounded sampling support with an unbounded one.
-- A log-prob over a bounded support (top-k / top-p recorded, tokens.support_size not null) is a
-- different quantity, so the step's drift statistics pool two kinds of token (group on
-- drift_tokens.support_size IS NULL to keep them apart).
-- Severity: warning
-- Grain: one row per mixing step (run, rollout_id).
-- Rule: among the step's drift_tokens, some have support_size null and some not. Parameters: none.
-- Inputs: drift_tokens.
SELECT
    run,
    rollout_id,
    count(*) FILTER (WHERE support_size IS NOT NULL) AS bounded_tokens,
    count(*) FILTER (WHERE support_size IS NULL) AS unbounded_tokens
FROM drift_tokens
GROUP BY run, rollout_id
HAVING count(*) FILTER (WHERE support_size IS NOT NULL) > 0
    AND count(*) FILTER (WHERE support_size IS NULL) > 0
ORDER BY run, rollout_id
