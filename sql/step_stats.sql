-- Per training step aggregates, the reference's STEP_AGGREGATE_METRICS (dump-format.md 6.4).
-- Grain: one row per run, rollout_id (training steps only; eval dumps excluded)
-- Inputs: sample_stats, group_stats (views over the base views samples, tokens), runs (base
--         view); macro step_reward (sql/macros)
-- Means skip NULLs and propagate NaN (one NaN per-sample value makes the step mean NaN).
-- Columns:
--   run                   VARCHAR  run name (partition)
--   rollout_id            BIGINT   training step (partition)
--   n_samples             BIGINT   rollout-dump samples of the step, with or without a train side
--   reward_mean           DOUBLE   mean of the non-NULL step rewards (step_reward: raw_reward for
--                                  miles and slime, NULL without train data; the logged reward
--                                  for NeMo-RL); NULL if none
--   reward_std            DOUBLE   sample std (n - 1) of the non-NULL step rewards; NULL if fewer
--                                  than 2
--   response_length_mean  DOUBLE   mean response length R (tokens)
--   truncated_frac        DOUBLE   fraction of samples truncated (0..1), over samples where it is
--                                  known; NULL when none is (NeMo-RL logs no truncation)
--   zero_std_group_frac   DOUBLE   fraction of the step's groups with a known zero_std that are
--                                  zero_std (each group counts once); NULL when none is known (no
--                                  reward data, or no prompt groups: NeMo-RL)
--   mean_abs_lp_diff      DOUBLE   unweighted mean of the per-sample mean_abs_lp_diff (nats)
--   mean_entropy          DOUBLE   unweighted mean of the per-sample mean_entropy (nats)
--   mixed_version_frac    DOUBLE   fraction of samples with mixed_version, over samples where it is
--                                  known
CREATE OR REPLACE VIEW step_stats AS
WITH train_samples AS (
    SELECT
        s.run,
        s.rollout_id,
        COUNT(*) AS n_samples,
        AVG(step_reward(r.framework, s.evaluation, s.reward, s.raw_reward)) AS reward_mean,
        STDDEV_SAMP(step_reward(r.framework, s.evaluation, s.reward, s.raw_reward)) AS reward_std,
        AVG(s.response_length) AS response_length_mean,
        AVG(s.truncated::INTEGER) AS truncated_frac,
        AVG(s.mean_abs_lp_diff) AS mean_abs_lp_diff,
        AVG(s.mean_entropy) AS mean_entropy,
        -- A NULL mixed_version stays NULL, so AVG skips samples without weight versions.
        AVG(s.mixed_version::INTEGER) AS mixed_version_frac
    FROM sample_stats AS s
    LEFT JOIN runs AS r ON r.run = s.run
    WHERE NOT s.evaluation
    GROUP BY
        s.run,
        s.rollout_id
),
train_groups AS (
    SELECT
        run,
        rollout_id,
        -- A NULL zero_std (unknown) is skipped; a step with none known gets NULL, not 0.
        AVG(zero_std::INTEGER) AS zero_std_group_frac
    FROM group_stats
    WHERE NOT evaluation
    GROUP BY
        run,
        rollout_id
)
SELECT
    s.run::VARCHAR AS run,
    s.rollout_id::BIGINT AS rollout_id,
    s.n_samples::BIGINT AS n_samples,
    s.reward_mean::DOUBLE AS reward_mean,
    s.reward_std::DOUBLE AS reward_std,
    s.response_length_mean::DOUBLE AS response_length_mean,
    s.truncated_frac::DOUBLE AS truncated_frac,
    g.zero_std_group_frac::DOUBLE AS zero_std_group_frac,
    s.mean_abs_lp_diff::DOUBLE AS mean_abs_lp_diff,
    s.mean_entropy::DOUBLE AS mean_entropy,
    s.mixed_version_frac::DOUBLE AS mixed_version_frac
FROM train_samples AS s
INNER JOIN train_groups AS g
    ON g.run = s.run
    AND g.rollout_id = s.rollout_id
ORDER BY s.run, s.rollout_id
