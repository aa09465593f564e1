-- Per prompt group (GRPO group) reward and length summary (dump-format.md 6.3).
-- Grain: one row per run, rollout_id, evaluation, group_index
-- Inputs: samples (base view), runs (base view); macro step_reward (sql/macros)
-- All samples with a NULL group_index of one dump (typically eval samples) form one group.
-- The reward is step_reward's: raw_reward for miles and slime training steps, the sample's
-- reward for other frameworks' (NeMo-RL) and for eval dumps (docs/columns.md).
-- Columns:
--   run                   VARCHAR  run name (partition)
--   rollout_id            BIGINT   training step the rollout dump belongs to (partition)
--   evaluation            BOOLEAN  true for groups of rollout_data/eval_{rid}.pt
--   group_index           BIGINT   GRPO prompt group (run-global); NULL = the samples without one
--   n                     BIGINT   samples in the group, including those without a reward
--   reward_mean           DOUBLE   mean of the non-NULL rewards; NULL if none
--   reward_std            DOUBLE   sample std (n - 1) of the non-NULL rewards; NULL if fewer than 2
--   response_length_mean  DOUBLE   mean response length R (tokens)
--   truncated_frac        DOUBLE   fraction of samples truncated (0..1)
--   zero_std              BOOLEAN  reward_std (NULL taken as 0) <= 1e-12: a degenerate group that
--                                  gives GRPO no signal; NULL when the group has no reward data
--                                  or is a training step's samples without a group_index (the
--                                  dump does not say which share a prompt, as in NeMo-RL's)
CREATE OR REPLACE VIEW group_stats AS
WITH group_rewards AS (
    SELECT
        s.run,
        s.rollout_id,
        s.evaluation,
        s.group_index,
        step_reward(r.framework, s.evaluation, s.reward, s.raw_reward) AS group_reward,
        s.response_length,
        s.truncated
    FROM samples AS s
    LEFT JOIN runs AS r ON r.run = s.run
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
    run::VARCHAR AS run,
    rollout_id::BIGINT AS rollout_id,
    evaluation::BOOLEAN AS evaluation,
    group_index::BIGINT AS group_index,
    n::BIGINT AS n,
    reward_mean::DOUBLE AS reward_mean,
    reward_std::DOUBLE AS reward_std,
    response_length_mean::DOUBLE AS response_length_mean,
    truncated_frac::DOUBLE AS truncated_frac,
    -- Unknown is NULL, not "not degenerate": no rewards, or no prompt groups in a training step.
    CASE
        WHEN reward_mean IS NULL OR (group_index IS NULL AND NOT evaluation) THEN NULL
        ELSE COALESCE(reward_std, 0.0) <= 1e-12
    END::BOOLEAN AS zero_std
FROM aggregated
ORDER BY run, rollout_id, evaluation, group_index NULLS FIRST
