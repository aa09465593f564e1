-- Drift by dumped rank (DP shard): is one trainer shard or node off?
-- Grain: one row per (run, rollout_id, dumped_rank) with at least one covered finite token.
-- Inputs: drift_tokens, samples; macro drift_breakdown (sql/macros).
-- Columns:
--   run, rollout_id          keys
--   dumped_rank     BIGINT   samples.dumped_rank: lowest global rank whose train file holds
--                            the sample (one per DP shard)
--   tokens          BIGINT   covered finite tokens
--   samples         BIGINT   samples with a covered finite token
--   mean_lp_diff    DOUBLE   mean delta (nats)
--   mean_abs_lp_diff DOUBLE  mean |delta| (nats, token mean)
--   max_abs_lp_diff DOUBLE   max |delta| (nats)
--   k3_kl           DOUBLE   mean of r - 1 - delta (nats)
--   k3_share        DOUBLE   the group's k3 sum / the step's k3 sum (fraction)
--   mult_prob_error DOUBLE   mean exp(|delta|) (ratio)
CREATE OR REPLACE VIEW drift_by_rank AS
WITH keyed AS (
    SELECT
        t.run,
        t.rollout_id,
        t.batch_position,
        '' AS share_scope,
        s.dumped_rank,
        t.lp_diff,
        t.abs_lp_diff,
        t.k3
    FROM drift_tokens AS t
    LEFT JOIN samples AS s
        ON s.run = t.run
        AND s.rollout_id = t.rollout_id
        AND NOT s.evaluation
        AND s.batch_position = t.batch_position
),
grouped AS MATERIALIZED (
    SELECT * FROM drift_breakdown(keyed)
)
SELECT
    run::VARCHAR AS run,  -- run name
    rollout_id::BIGINT AS rollout_id,  -- training step
    dumped_rank::BIGINT AS dumped_rank,  -- global rank
    tokens::BIGINT AS tokens,  -- covered finite tokens
    samples::BIGINT AS samples,  -- samples
    mean_lp_diff::DOUBLE AS mean_lp_diff,  -- nats
    mean_abs_lp_diff::DOUBLE AS mean_abs_lp_diff,  -- nats
    max_abs_lp_diff::DOUBLE AS max_abs_lp_diff,  -- nats
    k3_kl::DOUBLE AS k3_kl,  -- nats
    step_share(k3_sum, run, rollout_id, share_scope)::DOUBLE AS k3_share,  -- fraction of the step's k3 sum
    mult_prob_error::DOUBLE AS mult_prob_error  -- ratio
FROM grouped
ORDER BY run, rollout_id, dumped_rank
