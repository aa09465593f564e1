-- Training steps with samples kept in the batch but taken out of the loss (remove_sample).
-- A filter of the rollout set Sample.remove_sample; their tokens are in the lake, lp_diff NULL.
-- Severity: info
-- Grain: one row per training step with a removed sample (run, rollout_id).
-- Rule: not evaluation, samples.remove_sample. Parameters: none.
-- Inputs: samples.
-- Columns: run, rollout_id, samples (count), removed (count), removed_frac (fraction).
SELECT
    run::VARCHAR AS run,
    rollout_id::BIGINT AS rollout_id,
    COUNT(*)::BIGINT AS samples,
    COUNT(*) FILTER (WHERE remove_sample)::BIGINT AS removed,
    (COUNT(*) FILTER (WHERE remove_sample) / COUNT(*))::DOUBLE AS removed_frac
FROM samples
WHERE NOT evaluation
GROUP BY run, rollout_id
HAVING COUNT(*) FILTER (WHERE remove_sample) > 0
ORDER BY run, rollout_id
