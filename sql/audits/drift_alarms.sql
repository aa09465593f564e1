-- Training steps where a headline drift or health metric crosses its alarm threshold.
-- Grain: one row per (run, rollout_id, metric) that crosses.
-- Rules and parameters (drift_settings):
--   mean_abs_lp_diff_smtm > alarm_mean_abs_lp_diff_smtm (0.1)   from drift_steps
--   k3_kl                 > alarm_k3_kl (1e-3)                   from drift_steps
--   mult_prob_error       > alarm_mult_prob_error (1.05)         from drift_steps
--   ess                   < alarm_ess_min (0.3)                  from drift_steps
--   zero_std_group_frac  >= alarm_zero_std_group_frac (0.5)      from step_stats
--   truncated_frac       >= alarm_truncated_frac (0.25)          from step_stats
-- Every step is checked, not only the newest. A null metric never crosses.
-- Inputs: drift_steps, step_stats, drift_settings.
-- Columns: run, rollout_id, metric, value, rule ('>', '<', '>='), threshold.
WITH checks AS (
    SELECT d.run, d.rollout_id, 'mean_abs_lp_diff_smtm' AS metric,
        d.mean_abs_lp_diff_smtm AS value, '>' AS rule, s.alarm_mean_abs_lp_diff_smtm AS threshold
    FROM drift_steps AS d CROSS JOIN drift_settings AS s
    UNION ALL
    SELECT d.run, d.rollout_id, 'k3_kl', d.k3_kl, '>', s.alarm_k3_kl
    FROM drift_steps AS d CROSS JOIN drift_settings AS s
    UNION ALL
    SELECT d.run, d.rollout_id, 'mult_prob_error', d.mult_prob_error, '>', s.alarm_mult_prob_error
    FROM drift_steps AS d CROSS JOIN drift_settings AS s
    UNION ALL
    SELECT d.run, d.rollout_id, 'ess', d.ess, '<', s.alarm_ess_min
    FROM drift_steps AS d CROSS JOIN drift_settings AS s
    UNION ALL
    SELECT t.run, t.rollout_id, 'zero_std_group_frac', t.zero_std_group_frac, '>=',
        s.alarm_zero_std_group_frac
    FROM step_stats AS t CROSS JOIN drift_settings AS s
    UNION ALL
    SELECT t.run, t.rollout_id, 'truncated_frac', t.truncated_frac, '>=', s.alarm_truncated_frac
    FROM step_stats AS t CROSS JOIN drift_settings AS s
)
SELECT
    run::VARCHAR AS run,  -- run name
    rollout_id::BIGINT AS rollout_id,  -- training step
    metric::VARCHAR AS metric,  -- column of drift_steps or step_stats
    value::DOUBLE AS value,  -- the step's value
    rule::VARCHAR AS rule,  -- how value compares with threshold when the alarm fires
    threshold::DOUBLE AS threshold  -- from drift_settings
FROM checks
WHERE (rule = '>' AND value > threshold)
    OR (rule = '<' AND value < threshold)
    OR (rule = '>=' AND value >= threshold)
ORDER BY run, rollout_id, metric
