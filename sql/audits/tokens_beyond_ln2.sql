-- Training steps where over 1 % of the drift tokens have |delta| > ln 2 (alarm_beyond_ln2_frac).
-- The two engines disagree on those tokens' probability by more than a factor of 2, the band
-- IcePop masks (icepop_low, icepop_high = 0.5, 2). Gaussian drift at the drift_alarms gate
-- (mean |delta| 0.1) puts 4e-8 of its tokens there, so a share of 1 % is a tail that the mean
-- statistics can hide.
-- Severity: warning
-- Grain: one row per offending training step (run, rollout_id).
-- Rule: among the step's training drift tokens with a finite lp_diff, the fraction with
-- |lp_diff| > ln 2 is above alarm_beyond_ln2_frac.
-- Parameters (drift_settings): alarm_beyond_ln2_frac (0.01).
-- Inputs: drift_step_checks (the rollup of per-step drift-token counts), drift_settings.
-- Columns: run, rollout_id, tokens (count), beyond_ln2 (count), beyond_ln2_frac (fraction),
--   threshold (fraction).
SELECT
    p.run::VARCHAR AS run,
    p.rollout_id::BIGINT AS rollout_id,
    p.tokens::BIGINT AS tokens,
    p.beyond_ln2::BIGINT AS beyond_ln2,
    (p.beyond_ln2 / p.tokens)::DOUBLE AS beyond_ln2_frac,
    s.alarm_beyond_ln2_frac::DOUBLE AS threshold
FROM drift_step_checks AS p
CROSS JOIN drift_settings AS s
WHERE p.tokens > 0
    AND p.beyond_ln2 / p.tokens > s.alarm_beyond_ln2_frac
ORDER BY p.run, p.rollout_id
