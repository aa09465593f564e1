-- Training-step prompt groups whose rewards have zero spread (dump-format.md 6.3). GRPO gets
-- no learning signal from them. Eval groups are not listed.
-- Grain: one row per offending group (run, rollout_id, group_index).
-- Rule: group_stats.zero_std on a training step (reward_mean not null and reward_std, null
-- taken as 0, <= 1e-12). Parameters: none.
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
