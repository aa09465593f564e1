-- Training steps where a headline train/rollout drift metric crosses its alarm threshold.
-- Severity: error
-- Grain: one row per (run, rollout_id, metric) that crosses.
-- Rules and parameters (drift_settings; docs/drift.md says where each default comes from):
--   k3_kl                 > alarm_k3_kl (0.01)                   from drift_steps
--   mean_abs_lp_diff_smtm > alarm_mean_abs_lp_diff_smtm (0.1)    from drift_steps
--   mult_prob_error       > alarm_mult_prob_error (1.05)         from drift_steps
--   ess_raw               < alarm_ess_min (0.3)                  from drift_steps
-- Every step is checked, not only the newest. A null metric never crosses. drift_steps is read
-- once; its four metrics are unnested into rows.
-- Inputs: drift_steps, drift_settings.
-- Columns: run, rollout_id, metric, value, rule ('>' or '<'), threshold.
WITH checks AS (
    SELECT
        d.run,
        d.rollout_id,
        UNNEST([
            {'metric': 'k3_kl', 'value': d.k3_kl, 'rule': '>', 'threshold': s.alarm_k3_kl},
            {'metric': 'mean_abs_lp_diff_smtm', 'value': d.mean_abs_lp_diff_smtm, 'rule': '>',
                'threshold': s.alarm_mean_abs_lp_diff_smtm},
            {'metric': 'mult_prob_error', 'value': d.mult_prob_error, 'rule': '>',
                'threshold': s.alarm_mult_prob_error},
            {'metric': 'ess_raw', 'value': d.ess_raw, 'rule': '<', 'threshold': s.alarm_ess_min}
        ], max_depth := 2)
    FROM drift_steps AS d
    CROSS JOIN drift_settings AS s
)
SELECT
    run::VARCHAR AS run,  -- run name
    rollout_id::BIGINT AS rollout_id,  -- training step
    metric::VARCHAR AS metric,  -- column of drift_steps
    value::DOUBLE AS value,  -- the step's value
    rule::VARCHAR AS rule,  -- how value compares with threshold when the alarm fires
    threshold::DOUBLE AS threshold  -- from drift_settings
FROM checks
WHERE (rule = '>' AND value > threshold)
    OR (rule = '<' AND value < threshold)
ORDER BY run, rollout_id, metric
