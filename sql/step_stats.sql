-- Per training step aggregates, the reference's STEP_AGGREGATE_METRICS (dump-format.md 6.4).
-- Grain: one row per run, rollout_id (training steps only; eval dumps excluded)
-- Inputs: sample_stats, group_stats (views over the base views samples, tokens)
-- Means skip NULLs and propagate NaN (one NaN per-sample value makes the step mean NaN).
-- Columns:
--   run                   VARCHAR  run name (partition)
--   rollout_id            BIGINT   training step (partition)
--   n_samples             BIGINT   rollout-dump samples of the step, with or without a train side
--   reward_mean           DOUBLE   mean of the non-NULL raw_reward; NULL without train data
--   reward_std            DOUBLE   sample std (n - 1) of the non-NULL raw_reward; NULL if fewer
--                                  than 2
--   response_length_mean  DOUBLE   mean response length R (tokens)
--   truncated_frac        DOUBLE   fraction of samples truncated (0..1)
--   zero_std_group_frac   DOUBLE   fraction of the step's groups that are zero_std (each group
--                                  counts once; groups without reward data count as not zero_std)
--   mean_abs_lp_diff      DOUBLE   unweighted mean of the per-sample mean_abs_lp_diff (nats)
--   mean_entropy          DOUBLE   unweighted mean of the per-sample mean_entropy (nats)
--   mixed_version_frac    DOUBLE   fraction of samples with mixed_version, over samples where it is
--                                  known
CREATE OR REPLACE VIEW step_stats AS
WITH train_samples AS (
    SELECT
        run,
        rollout_id,
        COUNT(*) AS n_samples,
        AVG(raw_reward) AS reward_mean,
        STDDEV_SAMP(raw_reward) AS reward_std,
        AVG(response_length) AS response_length_mean,
        AVG(truncated::INTEGER) AS truncated_frac,
        AVG(mean_abs_lp_diff) AS mean_abs_lp_diff,
        AVG(mean_entropy) AS mean_entropy,
        -- A NULL mixed_version stays NULL, so AVG skips samples without weight versions.
        AVG(mixed_version::INTEGER) AS mixed_version_frac
    FROM sample_stats
    WHERE NOT evaluation
    GROUP BY
        run,
        rollout_id
),
train_groups AS (
    SELECT
        run,
        rollout_id,
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
