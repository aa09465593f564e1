-- Samples whose train-side per-token fields could not be reassembled. The CP/PP resolution
-- refused them (dump-format.md 4.5-4.7), so their per-token train values are null.
-- Severity: warning
-- Grain: one row per offending sample (run, rollout_id, evaluation, batch_position).
-- Rule: samples.alignment_failed. Parameters: none.
-- Inputs: samples.
SELECT
    run,
    rollout_id,
    evaluation,
    batch_position,
    sample_index,
    dumped_rank,
    response_length,
    train_response_length
FROM samples
WHERE alignment_failed
ORDER BY run, rollout_id, evaluation, batch_position
