-- The per-token breakdowns of a step's drift, from one pass over its tokens: the rollup behind
-- drift_by_position, drift_by_turn, drift_by_weight_version and drift_by_prob. Written for each
-- step at commit (docs/rollups.md).
-- Grain: one row per (run, rollout_id, dimension, key) with at least one covered finite token;
--        the key is `bucket` for every dimension but 'weight_version', whose key is
--        (token_version, token_staleness).
-- Inputs: drift_tokens; macros drift_parts, drift_rollup, log2_bucket (sql/macros).
-- Settings: none.
-- Dimensions (the view that reads each, and what `bucket` is there):
--   'position'        drift_by_position: floor(log2(position + 1)), log2-spaced response
--                     positions
--   'turn'            drift_by_turn: tokens.turn_index (null where the lake has none)
--   'weight_version'  drift_by_weight_version: bucket null; the keys are token_version and
--                     token_staleness (null where unknown)
--   'rollout_prob'    drift_by_prob: the exp(rollout_log_prob) bucket, 0..9, by the lower
--                     edges 0 | 1e-6 | 1e-5 | 1e-4 | 1e-3 | 1e-2 | 0.1 | 0.5 | 0.9 | 0.99
--   'entropy'         drift_by_prob: the entropy bucket, 0..6, by the lower edges
--                     -inf | 0.01 | 0.1 | 0.5 | 1 | 2 | 4 (nats); tokens without a dumped,
--                     or with a NaN or infinite, entropy are not in this dimension
-- Columns:
--   run              VARCHAR  run name
--   rollout_id       BIGINT   training step
--   dimension        VARCHAR  which breakdown the row belongs to (above)
--   bucket           INTEGER  the row's key in the dimension (above)
--   token_version    VARCHAR  'weight_version' rows: tokens.token_version; else null
--   token_staleness  BIGINT   'weight_version' rows: tokens.token_staleness (steps); else null
--   tokens           BIGINT   covered finite tokens with the key
--   samples          BIGINT   samples with such a token
--   mean_lp_diff     DOUBLE   mean delta (nats)
--   mean_abs_lp_diff DOUBLE   mean |delta| (nats)
--   max_abs_lp_diff  DOUBLE   max |delta| (nats)
--   k3_kl            DOUBLE   mean of r - 1 - delta (nats)
--   k3_sum           DOUBLE   sum of r - 1 - delta (nats): the views' k3_share divides it by
--                             the step's sum over the dimension
--   mult_prob_error  DOUBLE   mean exp(|delta|) (ratio)
CREATE OR REPLACE VIEW drift_breakdown_parts AS
WITH keyed AS (
    -- Every dimension's key of each token at once. The probability and entropy buckets are the
    -- lower edges of drift_by_prob's `edges` written out as CASE (4x cheaper per token than
    -- searching a list of the edges; tests/transform/test_breakdown_samples.py checks that
    -- both agree at every edge); the probability's from the top, where most tokens stop at
    -- the first test (a quarter cheaper on the bench step, whose tokens are less sure).
    -- NULL or non-finite entropy (broken data: a finite vocabulary's entropy is finite; NaN
    -- would compare above every edge): no entropy bucket.
    SELECT
        run,
        rollout_id,
        batch_position,
        log2_bucket(position + 1) AS position_bucket,
        turn_index,
        token_version,
        token_staleness,
        CASE
            WHEN rollout_prob >= 0.99 THEN 9
            WHEN rollout_prob >= 0.9 THEN 8
            WHEN rollout_prob >= 0.5 THEN 7
            WHEN rollout_prob >= 0.1 THEN 6
            WHEN rollout_prob >= 1e-2 THEN 5
            WHEN rollout_prob >= 1e-3 THEN 4
            WHEN rollout_prob >= 1e-4 THEN 3
            WHEN rollout_prob >= 1e-5 THEN 2
            WHEN rollout_prob >= 1e-6 THEN 1
            ELSE 0
        END AS prob_bucket,
        CASE
            WHEN entropy IS NULL OR NOT ISFINITE(entropy) THEN NULL
            WHEN entropy < 0.01 THEN 0
            WHEN entropy < 0.1 THEN 1
            WHEN entropy < 0.5 THEN 2
            WHEN entropy < 1.0 THEN 3
            WHEN entropy < 2.0 THEN 4
            WHEN entropy < 4.0 THEN 5
            ELSE 6
        END AS entropy_bucket,
        lp_diff,
        abs_lp_diff,
        k3
    FROM drift_tokens
),
parts AS MATERIALIZED (
    -- Partial sums per combination of all the keys and block of 256 samples: one hash
    -- aggregate over the tokens (a few thousand rows a step), which every dimension rolls up
    -- from (measured cheaper than a pass, or a grouping set, per dimension).
    SELECT * FROM drift_parts(keyed)
),
dimensions AS (
    SELECT
        'position' AS dimension,
        position_bucket AS bucket,
        NULL::VARCHAR AS token_version,
        NULL::BIGINT AS token_staleness,
        * EXCLUDE (position_bucket, turn_index, token_version, token_staleness, prob_bucket,
            entropy_bucket)
    FROM parts
    UNION ALL
    SELECT
        'turn' AS dimension,
        turn_index AS bucket,
        NULL::VARCHAR AS token_version,
        NULL::BIGINT AS token_staleness,
        * EXCLUDE (position_bucket, turn_index, token_version, token_staleness, prob_bucket,
            entropy_bucket)
    FROM parts
    UNION ALL
    SELECT
        'weight_version' AS dimension,
        NULL::INTEGER AS bucket,
        token_version,
        token_staleness,
        * EXCLUDE (position_bucket, turn_index, token_version, token_staleness, prob_bucket,
            entropy_bucket)
    FROM parts
    UNION ALL
    SELECT
        'rollout_prob' AS dimension,
        prob_bucket AS bucket,
        NULL::VARCHAR AS token_version,
        NULL::BIGINT AS token_staleness,
        * EXCLUDE (position_bucket, turn_index, token_version, token_staleness, prob_bucket,
            entropy_bucket)
    FROM parts
    UNION ALL
    SELECT
        'entropy' AS dimension,
        entropy_bucket AS bucket,
        NULL::VARCHAR AS token_version,
        NULL::BIGINT AS token_staleness,
        * EXCLUDE (position_bucket, turn_index, token_version, token_staleness, prob_bucket,
            entropy_bucket)
    FROM parts
    WHERE entropy_bucket IS NOT NULL
)
SELECT
    run::VARCHAR AS run,
    rollout_id::BIGINT AS rollout_id,
    dimension::VARCHAR AS dimension,
    bucket::INTEGER AS bucket,
    token_version::VARCHAR AS token_version,
    token_staleness::BIGINT AS token_staleness,
    tokens::BIGINT AS tokens,
    samples::BIGINT AS samples,
    mean_lp_diff::DOUBLE AS mean_lp_diff,
    mean_abs_lp_diff::DOUBLE AS mean_abs_lp_diff,
    max_abs_lp_diff::DOUBLE AS max_abs_lp_diff,
    k3_kl::DOUBLE AS k3_kl,
    k3_sum::DOUBLE AS k3_sum,
    mult_prob_error::DOUBLE AS mult_prob_error
FROM drift_rollup(dimensions)
