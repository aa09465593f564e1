-- Training steps where at least half of the groups with reward data have zero reward spread.
-- This is the miles dashboard's warning (dump-format.md 6.5); a few zero-std groups are routine
-- in GRPO, and `zero_std_group_list` lists them.
-- Severity: warning
-- Grain: one row per offending training step (run, rollout_id).
-- Rule: among the step's training prompt groups with reward data (group_stats.zero_std not
-- null: samples without a group_index are no prompt group), the fraction with zero_std is at
-- least alarm_zero_std_group_frac. Every step is checked, not
-- only the newest. Parameters (drift_settings): alarm_zero_std_group_frac (0.5).
-- Inputs: group_stats, drift_settings.
-- Columns: run, rollout_id, groups_with_reward (count), zero_std_groups (count),
--   zero_std_frac (fraction), threshold (fraction).
WITH per_step AS (
    SELECT
        run,
        rollout_id,
        COUNT(zero_std) AS groups_with_reward,
        COUNT(*) FILTER (WHERE zero_std) AS zero_std_groups
    FROM group_stats
    WHERE NOT evaluation
    GROUP BY run, rollout_id
)
SELECT
    p.run::VARCHAR AS run,  -- run name
    p.rollout_id::BIGINT AS rollout_id,  -- training step
    p.groups_with_reward::BIGINT AS groups_with_reward,  -- groups
    p.zero_std_groups::BIGINT AS zero_std_groups,  -- groups
    (p.zero_std_groups / p.groups_with_reward)::DOUBLE AS zero_std_frac,  -- fraction
    s.alarm_zero_std_group_frac::DOUBLE AS threshold  -- fraction
FROM per_step AS p
CROSS JOIN drift_settings AS s
WHERE p.groups_with_reward > 0
    AND p.zero_std_groups / p.groups_with_reward >= s.alarm_zero_std_group_frac
ORDER BY p.run, p.rollout_id
