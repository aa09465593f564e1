-- Per prompt group (GRPO group) reward and length summary (dump-format.md 6.3).
-- Grain: one row per run, rollout_id, evaluation, group_index
-- Inputs: samples (base view)
-- All samples with a NULL group_index of one dump (typically eval samples) form one group.
-- The reward is raw_reward for training steps and the rollout-side reward for eval dumps.
-- Columns:
--   run                    run name (partition)
--   rollout_id             training step the rollout dump belongs to (partition)
--   evaluation             true for groups of rollout_data/eval_{rid}.pt
--   group_index            GRPO prompt group (run-global); NULL = the samples without one
--   n                      samples in the group, including those without a reward
--   reward_mean            mean of the non-NULL rewards; NULL if none
--   reward_std             sample std (n - 1) of the non-NULL rewards; NULL if fewer than 2
--   response_length_mean   mean response length R (tokens)
--   truncated_frac         fraction of samples truncated (0..1)
--   zero_std               reward_mean is not NULL and reward_std (NULL taken as 0) <= 1e-12:
--                          a degenerate group that gives GRPO no signal
CREATE OR REPLACE VIEW group_stats AS
WITH group_rewards AS (
    SELECT
        run,
        rollout_id,
        evaluation,
        group_index,
        CASE WHEN evaluation THEN reward ELSE raw_reward END AS group_reward,
        response_length,
        truncated
    FROM samples
),
aggregated AS (
    SELECT
        run,
        rollout_id,
        evaluation,
        group_index,
        COUNT(*) AS n,
        AVG(group_reward) AS reward_mean,
        STDDEV_SAMP(group_reward) AS reward_std,
        AVG(response_length) AS response_length_mean,
        AVG(truncated::INTEGER) AS truncated_frac
    FROM group_rewards
    -- GROUP BY puts every NULL group_index into one group, as the reference does.
    GROUP BY
        run,
        rollout_id,
        evaluation,
        group_index
)
SELECT
    run::VARCHAR AS run, -- run name
    rollout_id::BIGINT AS rollout_id, -- step
    evaluation::BOOLEAN AS evaluation, -- eval dump group
    group_index::BIGINT AS group_index, -- GRPO group, NULL = ungrouped samples
    n::BIGINT AS n, -- samples
    reward_mean::DOUBLE AS reward_mean, -- reward units
    reward_std::DOUBLE AS reward_std, -- reward units
    response_length_mean::DOUBLE AS response_length_mean, -- tokens
    truncated_frac::DOUBLE AS truncated_frac, -- fraction 0..1
    (reward_mean IS NOT NULL AND COALESCE(reward_std, 0.0) <= 1e-12)::BOOLEAN AS zero_std -- degenerate group
FROM aggregated
ORDER BY run, rollout_id, evaluation, group_index NULLS FIRST
