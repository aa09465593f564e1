-- Drift by the engine's token probability (the low-probability tail) and by actor entropy.
-- Grain: one row per (run, rollout_id, dimension, bucket) with at least one covered finite
--        token; dimension is 'rollout_prob' or 'entropy'.
-- Buckets are half-open [bucket_low, bucket_high):
--   rollout_prob = exp(rollout_log_prob): 0 | 1e-6 | 1e-5 | 1e-4 | 1e-3 | 1e-2 | 0.1 | 0.5 |
--                  0.9 | 0.99 | inf   (buckets 0..9; bucket 9 includes probability 1)
--   entropy (nats): -inf | 0.01 | 0.1 | 0.5 | 1 | 2 | 4 | inf   (buckets 0..6; tokens without
--                  a dumped, or with a NaN or infinite, entropy are not in this dimension)
-- Inputs: drift_breakdown_parts (the per-step rollup, dimensions 'rollout_prob' and 'entropy',
--         whose buckets are the lower edges below); macro drift_statistics (sql/macros).
-- Columns:
--   run              VARCHAR  run name
--   rollout_id       BIGINT   training step
--   dimension        VARCHAR  'rollout_prob' or 'entropy'
--   bucket           INTEGER  0-based bucket index within the dimension, ascending
--   bucket_low       DOUBLE   inclusive lower edge (probability or nats)
--   bucket_high      DOUBLE   exclusive upper edge
--   + the columns of macro drift_statistics (sql/macros/drift_breakdown.sql): tokens,
--     samples, mean_lp_diff, mean_abs_lp_diff, max_abs_lp_diff, k3_kl, k3_share (within the
--     step and dimension), mult_prob_error
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
grouped AS MATERIALIZED (
    SELECT
        p.run,
        p.rollout_id,
        p.dimension AS share_scope,
        p.dimension,
        p.bucket,
        e.bucket_low,
        e.bucket_high,
        p.* EXCLUDE (run, rollout_id, dimension, bucket, token_version, token_staleness)
    FROM drift_breakdown_parts AS p
    JOIN edges AS e USING (dimension, bucket)
)
SELECT * REPLACE (
    dimension::VARCHAR AS dimension,
    bucket::INTEGER AS bucket,
    bucket_low::DOUBLE AS bucket_low,
    bucket_high::DOUBLE AS bucket_high
)
FROM drift_statistics(grouped)
ORDER BY run, rollout_id, dimension DESC, bucket
