-- Training steps that fail their own framework's published CI gate, computed that framework's way: slime's train/train_rollout_logprob_abs_diff above 0.1 nats, NeMo-RL's train/token_mult_prob_error at or above 1.05, miles' |rollout/log_probs - rollout/rollout_log_probs| above 0.03 nats (the limits in drift_settings, each cited in docs/drift.md).
-- A run is judged by the gate of the framework that wrote it (runs.framework), so a run its
-- framework's CI passes passes here; runs of a framework that publishes no gate, or whose
-- framework the lake did not record, are judged by drift_alarms instead.
-- Severity: error
-- Grain: one row per (run, rollout_id) whose framework_gate_passed is false.
-- Rule: drift_steps.framework_gate_passed is false (slime value > limit, miles value > limit,
-- NeMo-RL value >= limit). A null value (no covered token) never fails.
-- Parameters (drift_settings): gate_slime_abs_diff (0.1), gate_nemo_rl_mult_prob_error (1.05),
-- gate_miles_log_prob_diff (0.03).
-- Inputs: drift_steps, runs.
-- Columns: run, rollout_id, framework, gate (the framework's metric), value, rule ('>' or
--   '>='), threshold, source (the framework's file and line publishing the gate, short enough
--   for a terminal column; docs/drift.md gives the repositories and full paths).
SELECT
    d.run::VARCHAR AS run,  -- run name
    d.rollout_id::BIGINT AS rollout_id,  -- training step
    r.framework::VARCHAR AS framework,  -- runs.framework
    d.framework_gate::VARCHAR AS gate,  -- the framework's logged metric
    d.framework_gate_value::DOUBLE AS value,  -- computed the framework's way
    (CASE WHEN r.framework = 'nemo-rl' THEN '>=' ELSE '>' END)::VARCHAR AS rule,  -- fails when
    d.framework_gate_limit::DOUBLE AS threshold,  -- from drift_settings
    (CASE r.framework
        WHEN 'slime' THEN 'slime megatron_utils/model.py:900-902'
        WHEN 'nemo-rl' THEN 'NeMo-RL functional/grpo_megatron.sh:44'
        WHEN 'miles' THEN 'miles training_utils/log_utils.py:285'
    END)::VARCHAR AS source  -- the framework's file and lines
FROM drift_steps AS d
JOIN runs AS r ON r.run = d.run
WHERE NOT d.framework_gate_passed
ORDER BY d.run, d.rollout_id
