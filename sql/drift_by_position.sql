-- Drift by response position: does the mismatch grow along the response?
-- Grain: one row per (run, rollout_id, position_bucket) with at least one covered finite token.
-- Buckets are log2-spaced: bucket b holds response positions [2^b - 1, 2^(b+1) - 2], i.e.
--   0: {0}, 1: {1, 2}, 2: {3..6}, 3: {7..14}, ...
-- Inputs: drift_tokens; macros drift_breakdown, log2_bucket (sql/macros).
-- Columns:
--   run, rollout_id          keys
--   position_bucket INTEGER  b = floor(log2(position + 1))
--   position_low    INTEGER  first response position of the bucket (0-based)
--   position_high   INTEGER  last response position of the bucket (inclusive)
--   tokens          BIGINT   covered finite tokens in the bucket
--   samples         BIGINT   samples with a token in the bucket
--   mean_lp_diff    DOUBLE   mean delta (nats)
--   mean_abs_lp_diff DOUBLE  mean |delta| (nats)
--   max_abs_lp_diff DOUBLE   max |delta| (nats)
--   k3_kl           DOUBLE   mean of r - 1 - delta (nats)
--   k3_share        DOUBLE   the bucket's sum of k3 / the step's sum of k3 (fraction)
--   mult_prob_error DOUBLE   mean exp(|delta|) (ratio)
CREATE OR REPLACE VIEW drift_by_position AS
WITH keyed AS (
    SELECT
        run,
        rollout_id,
        batch_position,
        '' AS share_scope,
        log2_bucket(position + 1) AS position_bucket,
        lp_diff,
        abs_lp_diff,
        k3
    FROM drift_tokens
),
grouped AS MATERIALIZED (
    SELECT * FROM drift_breakdown(keyed)
)
SELECT
    run::VARCHAR AS run,  -- run name
    rollout_id::BIGINT AS rollout_id,  -- training step
    position_bucket::INTEGER AS position_bucket,  -- floor(log2(position + 1))
    (2 ** position_bucket - 1)::INTEGER AS position_low,  -- first position, inclusive
    (2 ** (position_bucket + 1) - 2)::INTEGER AS position_high,  -- last position, inclusive
    tokens::BIGINT AS tokens,  -- covered finite tokens
    samples::BIGINT AS samples,  -- samples
    mean_lp_diff::DOUBLE AS mean_lp_diff,  -- nats
    mean_abs_lp_diff::DOUBLE AS mean_abs_lp_diff,  -- nats
    max_abs_lp_diff::DOUBLE AS max_abs_lp_diff,  -- nats
    k3_kl::DOUBLE AS k3_kl,  -- nats
    step_share(k3_sum, run, rollout_id, share_scope)::DOUBLE AS k3_share,  -- fraction of the step's k3 sum
    mult_prob_error::DOUBLE AS mult_prob_error  -- ratio
FROM grouped
ORDER BY run, rollout_id, position_bucket
