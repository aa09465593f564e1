-- The one aggregate block of the drift_by_* views, as DuckDB macros: table macros drift_terms,
-- drift_parts, drift_counts, drift_sums, drift_means, drift_totals, drift_rollup,
-- drift_breakdown and drift_statistics (the views' shared output columns), and the scalar
-- macro step_share.
--
-- drift_breakdown(keyed): `keyed` names a relation (a CTE of the calling view) with one row per
-- covered finite token and the columns run, rollout_id, batch_position, share_scope, the
-- view's key columns, lp_diff, abs_lp_diff and k3 (from drift_tokens). Every other column is
-- a key. Returns one row per (run, rollout_id, share_scope, keys) with the statistics below.
--
-- drift_rollup(parts): the same result from partial sums (drift_parts' columns, one row per
-- keys and sample_block, several rows may share them); drift_by_prob rolls one pass over the
-- tokens up into two dimensions with it.
--
-- `samples` is exact without COUNT(DISTINCT batch_position): a token sets bit
-- (batch_position & 255) of its group's 256-bit sample set (four UBIGINT words), one set per
-- block of 256 batch positions (`sample_block` = batch_position >> 8); the sets are OR-ed and
-- the bits counted. With 512 samples a step that is two rows per key instead of a second hash
-- table with one entry per (key, sample): drift_by_token (one key per vocabulary entry) ran in
-- about half the time (docs/performance.md). drift_by_token does without sets: one
-- drift_terms row per token, its `samples` 1 on drift_tokens.first_occurrence (a sample's
-- first row with the token id), summed by drift_sums.
--
-- drift_sums(counted): the partial sums of `counted` (drift_terms' or drift_sums' columns)
-- added up per key: what the rollup drift_token_id_parts stores (sums of float32 deltas
-- compress to about 60 % of the bytes of their means). drift_means(summed) divides one row's
-- sums by its `tokens` (drift_by_token over that rollup); drift_totals(counted) is the two in
-- turn.
-- Columns added:
--   tokens           BIGINT  covered finite tokens
--   samples          BIGINT  samples with such a token
--   mean_lp_diff     DOUBLE  mean delta (nats)
--   mean_abs_lp_diff DOUBLE  mean |delta| (nats)
--   max_abs_lp_diff  DOUBLE  max |delta| (nats)
--   k3_kl            DOUBLE  mean of r - 1 - delta (nats)
--   k3_sum           DOUBLE  sum of r - 1 - delta (nats)
--   mult_prob_error  DOUBLE  mean exp(|delta|) (ratio)
-- drift_statistics (below) turns them into a view's output columns, with k3_share =
-- step_share(k3_sum, run, rollout_id, share_scope): k3_sum over the sum of k3_sum across the
-- step's rows with the same share_scope (fraction).

-- drift_terms(keyed): one row per row of keyed, with its contribution to each partial sum
-- below (tokens 1, lp_diff_sum delta, abs_lp_diff_sum and max_abs_lp_diff |delta|, k3_sum k3,
-- exp_abs_lp_diff_sum exp(|delta|)); keyed's other columns pass through.
CREATE OR REPLACE MACRO drift_terms(keyed) AS TABLE
SELECT
    * EXCLUDE (lp_diff, abs_lp_diff, k3),
    1 AS tokens,
    lp_diff AS lp_diff_sum,
    abs_lp_diff AS abs_lp_diff_sum,
    abs_lp_diff AS max_abs_lp_diff,
    k3 AS k3_sum,
    EXP(abs_lp_diff) AS exp_abs_lp_diff_sum
FROM query_table(keyed);

-- drift_parts(keyed): partial sums per (keys, sample_block) of per-token rows, with the
-- block's 256-bit sample set. (A CASE per word measured cheaper than FILTER clauses; the
-- shift is UBIGINT, not HUGEINT.)
CREATE OR REPLACE MACRO drift_parts(keyed) AS TABLE
SELECT
    * EXCLUDE (batch_position, tokens, lp_diff_sum, abs_lp_diff_sum, max_abs_lp_diff, k3_sum,
        exp_abs_lp_diff_sum),
    batch_position >> 8 AS sample_block,
    COUNT(*) AS tokens,
    BIT_OR(CASE WHEN (batch_position >> 6) & 3 = 0 THEN 1::UBIGINT << (batch_position & 63)::UBIGINT
        ELSE 0::UBIGINT END) AS sample_bits_0,
    BIT_OR(CASE WHEN (batch_position >> 6) & 3 = 1 THEN 1::UBIGINT << (batch_position & 63)::UBIGINT
        ELSE 0::UBIGINT END) AS sample_bits_1,
    BIT_OR(CASE WHEN (batch_position >> 6) & 3 = 2 THEN 1::UBIGINT << (batch_position & 63)::UBIGINT
        ELSE 0::UBIGINT END) AS sample_bits_2,
    BIT_OR(CASE WHEN (batch_position >> 6) & 3 = 3 THEN 1::UBIGINT << (batch_position & 63)::UBIGINT
        ELSE 0::UBIGINT END) AS sample_bits_3,
    SUM(lp_diff_sum) AS lp_diff_sum,
    SUM(abs_lp_diff_sum) AS abs_lp_diff_sum,
    MAX(max_abs_lp_diff) AS max_abs_lp_diff,
    SUM(k3_sum) AS k3_sum,
    SUM(exp_abs_lp_diff_sum) AS exp_abs_lp_diff_sum
FROM drift_terms(keyed)
GROUP BY ALL;

-- drift_totals(counted): the statistics per keys from rows of partial sums (drift_terms' or
-- drift_parts' columns) whose `samples` counts samples that no other row of the same keys
-- counts, so the counts add up: drift_counts' rows (one per keys and sample_block), or one
-- row per token with samples 1 on the sample's first row of the keys (drift_by_token).
CREATE OR REPLACE MACRO drift_sums(counted) AS TABLE
SELECT
    * EXCLUDE (tokens, samples, lp_diff_sum, abs_lp_diff_sum, max_abs_lp_diff, k3_sum,
        exp_abs_lp_diff_sum),
    SUM(tokens)::BIGINT AS tokens,
    SUM(samples)::BIGINT AS samples,
    SUM(lp_diff_sum) AS lp_diff_sum,
    SUM(abs_lp_diff_sum) AS abs_lp_diff_sum,
    MAX(max_abs_lp_diff) AS max_abs_lp_diff,
    SUM(k3_sum) AS k3_sum,
    SUM(exp_abs_lp_diff_sum) AS exp_abs_lp_diff_sum
FROM query_table(counted)
GROUP BY ALL;

CREATE OR REPLACE MACRO drift_means(summed) AS TABLE
SELECT
    * EXCLUDE (lp_diff_sum, abs_lp_diff_sum, k3_sum, exp_abs_lp_diff_sum, max_abs_lp_diff),
    lp_diff_sum / tokens AS mean_lp_diff,
    abs_lp_diff_sum / tokens AS mean_abs_lp_diff,
    max_abs_lp_diff,
    k3_sum / tokens AS k3_kl,
    k3_sum,
    exp_abs_lp_diff_sum / tokens AS mult_prob_error
FROM query_table(summed);

CREATE OR REPLACE MACRO drift_totals(counted) AS TABLE
WITH summed AS (
    SELECT * FROM drift_sums(counted)
)
SELECT * FROM drift_means(summed);

CREATE OR REPLACE MACRO drift_counts(blocks) AS TABLE
SELECT
    * EXCLUDE (sample_block, sample_bits_0, sample_bits_1, sample_bits_2, sample_bits_3),
    BIT_COUNT(sample_bits_0) + BIT_COUNT(sample_bits_1) + BIT_COUNT(sample_bits_2)
        + BIT_COUNT(sample_bits_3) AS samples
FROM query_table(blocks);

-- drift_rollup(parts): parts that may share (keys, sample_block) are OR-ed together first, so
-- a sample counts once however many parts hold it.
CREATE OR REPLACE MACRO drift_rollup(parts) AS TABLE
WITH blocks AS (
    SELECT
        * EXCLUDE (tokens, sample_bits_0, sample_bits_1, sample_bits_2, sample_bits_3,
            lp_diff_sum, abs_lp_diff_sum, max_abs_lp_diff, k3_sum, exp_abs_lp_diff_sum),
        SUM(tokens) AS tokens,
        BIT_OR(sample_bits_0) AS sample_bits_0,
        BIT_OR(sample_bits_1) AS sample_bits_1,
        BIT_OR(sample_bits_2) AS sample_bits_2,
        BIT_OR(sample_bits_3) AS sample_bits_3,
        SUM(lp_diff_sum) AS lp_diff_sum,
        SUM(abs_lp_diff_sum) AS abs_lp_diff_sum,
        MAX(max_abs_lp_diff) AS max_abs_lp_diff,
        SUM(k3_sum) AS k3_sum,
        SUM(exp_abs_lp_diff_sum) AS exp_abs_lp_diff_sum
    FROM query_table(parts)
    GROUP BY ALL
),
counted AS (
    SELECT * FROM drift_counts(blocks)
)
SELECT * FROM drift_totals(counted);

-- step_share(x, run, rollout_id, scope): x over the sum of x across the step's rows of the
-- same scope (null when that sum is 0). It is applied (by drift_statistics or the view) to the
-- view's MATERIALIZED CTE of drift_breakdown's rows: DuckDB turns this window into a join
-- with its own aggregate, which would otherwise compute the whole breakdown (down to the read
-- of the tokens) a second time. (A MATERIALIZED CTE inside a table macro is not kept
-- materialized, so the CTE is the view's, and drift_statistics only reads it.)
CREATE OR REPLACE MACRO step_share(x, run, rollout_id, scope) AS
    x / NULLIF(SUM(x) OVER (PARTITION BY run, rollout_id, scope), 0);

-- drift_statistics(grouped): the output columns of a drift_by_* view from its MATERIALIZED
-- CTE of drift_breakdown's (or drift_rollup's) rows, the one place their casts are written:
-- run (VARCHAR) and rollout_id (BIGINT) first, then grouped's other key columns as they are
-- (the view casts them), then the statistics below, in this order. share_scope and k3_sum are
-- dropped; k3_share takes k3_sum's place.
-- Columns:
--   tokens           BIGINT  covered finite tokens in the group
--   samples          BIGINT  samples with a covered finite token in the group
--   mean_lp_diff     DOUBLE  mean delta (nats)
--   mean_abs_lp_diff DOUBLE  mean |delta| (nats, token mean)
--   max_abs_lp_diff  DOUBLE  max |delta| (nats)
--   k3_kl            DOUBLE  mean of r - 1 - delta (nats)
--   k3_share         DOUBLE  the group's k3 sum / the step's k3 sum within the share_scope
--                            (fraction; null when the step's sum is 0)
--   mult_prob_error  DOUBLE  mean exp(|delta|) (ratio)
CREATE OR REPLACE MACRO drift_statistics(grouped) AS TABLE
SELECT
    run::VARCHAR AS run,
    rollout_id::BIGINT AS rollout_id,
    * EXCLUDE (run, rollout_id, share_scope, tokens, samples, mean_lp_diff, mean_abs_lp_diff,
        max_abs_lp_diff, k3_kl, k3_sum, mult_prob_error),
    tokens::BIGINT AS tokens,
    samples::BIGINT AS samples,
    mean_lp_diff::DOUBLE AS mean_lp_diff,
    mean_abs_lp_diff::DOUBLE AS mean_abs_lp_diff,
    max_abs_lp_diff::DOUBLE AS max_abs_lp_diff,
    k3_kl::DOUBLE AS k3_kl,
    step_share(k3_sum, run, rollout_id, share_scope)::DOUBLE AS k3_share,
    mult_prob_error::DOUBLE AS mult_prob_error
FROM query_table(grouped);

-- drift_breakdown(keyed): drift_parts' rows are already unique per (keys, sample_block).
CREATE OR REPLACE MACRO drift_breakdown(keyed) AS TABLE
WITH parts AS (
    SELECT * FROM drift_parts(keyed)
),
counted AS (
    SELECT * FROM drift_counts(parts)
)
SELECT * FROM drift_totals(counted);
