-- Drift by response length: do long responses drift more?
-- Grain: one row per (run, rollout_id, length_bucket) with at least one covered finite token.
-- Buckets are log2-spaced on samples.response_length R: bucket b holds R in
--   [2^b, 2^(b+1) - 1], i.e. 0: {1}, 1: {2, 3}, 2: {4..7}, ...; null when R is unknown.
-- Inputs: drift_tokens, samples; macros drift_breakdown, log2_bucket (sql/macros).
-- Columns:
--   run, rollout_id          keys
--   length_bucket   INTEGER  floor(log2(response_length))
--   length_low      INTEGER  shortest response length of the bucket (tokens)
--   length_high     INTEGER  longest response length of the bucket (tokens, inclusive)
--   tokens          BIGINT   covered finite tokens
--   samples         BIGINT   samples with a covered finite token
--   mean_lp_diff    DOUBLE   mean delta (nats)
--   mean_abs_lp_diff DOUBLE  mean |delta| (nats, token mean)
--   max_abs_lp_diff DOUBLE   max |delta| (nats)
--   k3_kl           DOUBLE   mean of r - 1 - delta (nats)
--   k3_share        DOUBLE   the group's k3 sum / the step's k3 sum (fraction)
--   mult_prob_error DOUBLE   mean exp(|delta|) (ratio)
CREATE OR REPLACE VIEW drift_by_length AS
WITH keyed AS (
    SELECT
        t.run,
        t.rollout_id,
        t.batch_position,
        '' AS share_scope,
        log2_bucket(s.response_length) AS length_bucket,
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
    length_bucket::INTEGER AS length_bucket,  -- floor(log2(response_length))
    (2 ** length_bucket)::INTEGER AS length_low,  -- tokens, inclusive
    (2 ** (length_bucket + 1) - 1)::INTEGER AS length_high,  -- tokens, inclusive
    tokens::BIGINT AS tokens,  -- covered finite tokens
    samples::BIGINT AS samples,  -- samples
    mean_lp_diff::DOUBLE AS mean_lp_diff,  -- nats
    mean_abs_lp_diff::DOUBLE AS mean_abs_lp_diff,  -- nats
    max_abs_lp_diff::DOUBLE AS max_abs_lp_diff,  -- nats
    k3_kl::DOUBLE AS k3_kl,  -- nats
    step_share(k3_sum, run, rollout_id, share_scope)::DOUBLE AS k3_share,  -- fraction of the step's k3 sum
    mult_prob_error::DOUBLE AS mult_prob_error  -- ratio
FROM grouped
ORDER BY run, rollout_id, length_bucket
