-- Training steps whose rollout log-probs match the trainer's one position away, not their own.
-- The two sides are then off by one token (a shifted slice, a lost first token, a boundary
-- counted twice), so every lp_diff compares different tokens.
-- Severity: error
-- Grain: one row per offending training step (run, rollout_id).
-- Rule: over the step's drift tokens (train and rollout log-probs both present), the
-- correlation of the train log-prob with the rollout log-prob of the next (or the previous)
-- position of the same sample is at least shift_min_corr and above the correlation at the same
-- position; judged only with at least shift_min_tokens such pairs. Healthy drift keeps the
-- same-position correlation near 1; unrelated log-probs (noise) track no neighbour.
-- Parameters (drift_settings): shift_min_corr (0.9), shift_min_tokens (32).
-- Inputs: drift_step_checks (the rollup of per-step pair counts and correlations),
--         drift_settings.
-- Columns: run, rollout_id, pairs (count), corr_same (same position), corr_next (the rollout
--   log-prob one position later), corr_previous (one position earlier), threshold.
SELECT
    p.run::VARCHAR AS run,
    p.rollout_id::BIGINT AS rollout_id,
    p.pairs::BIGINT AS pairs,
    p.corr_same::DOUBLE AS corr_same,
    p.corr_next::DOUBLE AS corr_next,
    p.corr_previous::DOUBLE AS corr_previous,
    s.shift_min_corr::DOUBLE AS threshold
FROM drift_step_checks AS p
CROSS JOIN drift_settings AS s
WHERE p.pairs >= s.shift_min_tokens
    AND GREATEST(p.corr_next, p.corr_previous) >= s.shift_min_corr
    AND GREATEST(p.corr_next, p.corr_previous) > COALESCE(p.corr_same, -1)
ORDER BY p.run, p.rollout_id
