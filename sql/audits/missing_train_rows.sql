-- Training-step samples of the rollout dump that no train file holds. Usual causes: dropped
-- trailing rollouts, a missing or crashed rank, or a step still training (dump-format.md 8.3).
-- Eval samples never have train rows and are not listed.
-- Severity: warning
-- Grain: one row per offending sample (run, rollout_id, batch_position).
-- Rule: not evaluation and not has_train_row. Parameters: none.
-- Inputs: samples.
SELECT
    run,
    rollout_id,
    batch_position,
    sample_index,
    group_index,
    status,
    remove_sample,
    response_length
FROM samples
WHERE NOT evaluation
    AND NOT has_train_row
ORDER BY run, rollout_id, batch_position
