-- Training steps of runs whose framework publishes no drift gate (framework_gates judges the others by their own) where one of tokenlake's cross-framework alarms fires: k3_kl above 0.01 (what Gaussian drift has at slime's 0.1 gate), mean_abs_lp_diff_smtm above 0.1 (slime's gate, over covered samples), mult_prob_error above 1.05 (NeMo-RL's gate), ess_raw below 0.3 (tokenlake's own; no framework publishes one).
-- Each row's `evidence` says what sets its threshold (docs/drift.md, "Where the alarm defaults
-- come from"). A run of slime, NeMo-RL or miles is not listed here: its own framework's gate
-- decides (audit framework_gates), and its drift_steps columns keep these metrics.
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
-- Columns: run, rollout_id, metric, value, rule ('>' or '<'), threshold, evidence (what sets the
--   threshold).
WITH checks AS (
    SELECT
        d.run,
        d.rollout_id,
        UNNEST([
            {'metric': 'k3_kl', 'value': d.k3_kl, 'rule': '>', 'threshold': s.alarm_k3_kl,
                'evidence': 'Gaussian drift at slime''s 0.1 gate has k3 0.008'},
            {'metric': 'mean_abs_lp_diff_smtm', 'value': d.mean_abs_lp_diff_smtm, 'rule': '>',
                'threshold': s.alarm_mean_abs_lp_diff_smtm,
                'evidence': 'slime''s CI gate on train_rollout_logprob_abs_diff'},
            {'metric': 'mult_prob_error', 'value': d.mult_prob_error, 'rule': '>',
                'threshold': s.alarm_mult_prob_error,
                'evidence': 'NeMo-RL''s CI gate on token_mult_prob_error'},
            {'metric': 'ess_raw', 'value': d.ess_raw, 'rule': '<', 'threshold': s.alarm_ess_min,
                'evidence': 'tokenlake''s own: under a third of the tokens carry the weight'}
        ], max_depth := 2)
    FROM drift_steps AS d
    CROSS JOIN drift_settings AS s
    -- A run whose framework publishes a gate is judged by it (framework_gates), not by these.
    WHERE d.framework_gate IS NULL
)
SELECT
    run::VARCHAR AS run,  -- run name
    rollout_id::BIGINT AS rollout_id,  -- training step
    metric::VARCHAR AS metric,  -- column of drift_steps
    value::DOUBLE AS value,  -- the step's value
    rule::VARCHAR AS rule,  -- how value compares with threshold when the alarm fires
    threshold::DOUBLE AS threshold,  -- from drift_settings
    evidence::VARCHAR AS evidence  -- what sets the threshold
FROM checks
WHERE (rule = '>' AND value > threshold)
    OR (rule = '<' AND value < threshold)
ORDER BY run, rollout_id, metric
