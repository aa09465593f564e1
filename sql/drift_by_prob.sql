-- Drift by the engine's token probability (the low-probability tail) and by actor entropy.
-- Grain: one row per (run, rollout_id, dimension, bucket) with at least one covered finite
--        token; dimension is 'rollout_prob' or 'entropy'.
-- Buckets are half-open [bucket_low, bucket_high):
--   rollout_prob = exp(rollout_log_prob): 0 | 1e-6 | 1e-5 | 1e-4 | 1e-3 | 1e-2 | 0.1 | 0.5 |
--                  0.9 | 0.99 | inf   (buckets 0..9; bucket 9 includes probability 1)
--   entropy (nats): -inf | 0.01 | 0.1 | 0.5 | 1 | 2 | 4 | inf   (buckets 0..6; tokens without
--                  a dumped entropy are not in this dimension)
-- Inputs: drift_tokens.
-- Columns:
--   run, rollout_id          keys
--   dimension       VARCHAR  'rollout_prob' or 'entropy'
--   bucket          INTEGER  0-based bucket index within the dimension, ascending
--   bucket_low      DOUBLE   inclusive lower edge (probability or nats)
--   bucket_high     DOUBLE   exclusive upper edge
--   tokens          BIGINT   covered finite tokens in the bucket
--   samples         BIGINT   samples with a token in the bucket
--   mean_lp_diff    DOUBLE   mean delta (nats)
--   mean_abs_lp_diff DOUBLE  mean |delta| (nats)
--   max_abs_lp_diff DOUBLE   max |delta| (nats)
--   k3_kl           DOUBLE   mean of r - 1 - delta (nats)
--   k3_share        DOUBLE   bucket's k3 sum / the step's k3 sum in this dimension (fraction)
--   mult_prob_error DOUBLE   mean exp(|delta|) (ratio)
CREATE OR REPLACE VIEW drift_by_prob AS
WITH edges (dimension, bucket, bucket_low, bucket_high) AS (
    VALUES
        ('rollout_prob', 0, 0.0::DOUBLE, 1e-6::DOUBLE),
        ('rollout_prob', 1, 1e-6, 1e-5),
        ('rollout_prob', 2, 1e-5, 1e-4),
        ('rollout_prob', 3, 1e-4, 1e-3),
        ('rollout_prob', 4, 1e-3, 1e-2),
        ('rollout_prob', 5, 1e-2, 0.1),
        ('rollout_prob', 6, 0.1, 0.5),
        ('rollout_prob', 7, 0.5, 0.9),
        ('rollout_prob', 8, 0.9, 0.99),
        ('rollout_prob', 9, 0.99, 'inf'::DOUBLE),
        ('entropy', 0, '-inf'::DOUBLE, 0.01),
        ('entropy', 1, 0.01, 0.1),
        ('entropy', 2, 0.1, 0.5),
        ('entropy', 3, 0.5, 1.0),
        ('entropy', 4, 1.0, 2.0),
        ('entropy', 5, 2.0, 4.0),
        ('entropy', 6, 4.0, 'inf'::DOUBLE)
),
measured AS (
    SELECT t.*, 'rollout_prob' AS dimension, t.rollout_prob AS x FROM drift_tokens AS t
    UNION ALL
    SELECT t.*, 'entropy' AS dimension, t.entropy AS x FROM drift_tokens AS t
    WHERE t.entropy IS NOT NULL
),
grouped AS (
    SELECT
        m.run,
        m.rollout_id,
        e.dimension,
        e.bucket,
        any_value(e.bucket_low) AS bucket_low,
        any_value(e.bucket_high) AS bucket_high,
        count(*) AS tokens,
        count(DISTINCT m.batch_position) AS samples,
        avg(m.lp_diff) AS mean_lp_diff,
        avg(m.abs_lp_diff) AS mean_abs_lp_diff,
        max(m.abs_lp_diff) AS max_abs_lp_diff,
        avg(m.k3) AS k3_kl,
        sum(m.k3) / nullif(sum(sum(m.k3)) OVER (PARTITION BY m.run, m.rollout_id, e.dimension), 0)
            AS k3_share,
        avg(exp(m.abs_lp_diff)) AS mult_prob_error
    FROM measured AS m
    JOIN edges AS e
        ON m.dimension = e.dimension AND m.x >= e.bucket_low AND m.x < e.bucket_high
    GROUP BY m.run, m.rollout_id, e.dimension, e.bucket
)
SELECT
    run::VARCHAR AS run,  -- run name
    rollout_id::BIGINT AS rollout_id,  -- training step
    dimension::VARCHAR AS dimension,  -- 'rollout_prob' or 'entropy'
    bucket::INTEGER AS bucket,  -- ascending bucket index
    bucket_low::DOUBLE AS bucket_low,  -- inclusive lower edge
    bucket_high::DOUBLE AS bucket_high,  -- exclusive upper edge
    tokens::BIGINT AS tokens,  -- covered finite tokens
    samples::BIGINT AS samples,  -- samples
    mean_lp_diff::DOUBLE AS mean_lp_diff,  -- nats
    mean_abs_lp_diff::DOUBLE AS mean_abs_lp_diff,  -- nats
    max_abs_lp_diff::DOUBLE AS max_abs_lp_diff,  -- nats
    k3_kl::DOUBLE AS k3_kl,  -- nats
    k3_share::DOUBLE AS k3_share,  -- fraction of the step's k3 sum in the dimension
    mult_prob_error::DOUBLE AS mult_prob_error  -- ratio
FROM grouped
ORDER BY run, rollout_id, dimension DESC, bucket
