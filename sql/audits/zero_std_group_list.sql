-- Training-step prompt groups whose rewards have zero spread, listed for reading. GRPO gets no
-- learning signal from them (dump-format.md 6.3), but a few per step are routine; the audit
-- `zero_std_groups` warns when they reach the dashboard's share. Eval groups are not listed.
-- Severity: info
-- Grain: one row per zero-std group (run, rollout_id, group_index).
-- Rule: group_stats.zero_std on a training step (reward_std, null taken as 0, <= 1e-12, in a
-- prompt group with reward data; a NULL zero_std is unknown and not listed). Parameters: none.
-- Inputs: group_stats.
SELECT
    run,
    rollout_id,
    group_index,
    n,
    reward_mean,
    reward_std
FROM group_stats
WHERE NOT evaluation
    AND zero_std
ORDER BY run, rollout_id, group_index
