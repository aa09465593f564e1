-- Training steps where at least a quarter of the samples were truncated at the length limit.
-- This is the miles dashboard's warning (dump-format.md 6.5).
-- Severity: warning
-- Grain: one row per offending training step (run, rollout_id).
-- Rule: step_stats.truncated_frac >= alarm_truncated_frac. Every step is checked, not only the
-- newest. Parameters (drift_settings): alarm_truncated_frac (0.25).
-- Inputs: step_stats, drift_settings.
-- Columns: run, rollout_id, n_samples (count), truncated_frac (fraction), threshold (fraction).
SELECT
    t.run::VARCHAR AS run,  -- run name
    t.rollout_id::BIGINT AS rollout_id,  -- training step
    t.n_samples::BIGINT AS n_samples,  -- samples
    t.truncated_frac::DOUBLE AS truncated_frac,  -- fraction
    s.alarm_truncated_frac::DOUBLE AS threshold  -- fraction
FROM step_stats AS t
CROSS JOIN drift_settings AS s
WHERE t.truncated_frac >= s.alarm_truncated_frac
ORDER BY t.run, t.rollout_id
