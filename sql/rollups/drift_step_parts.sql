-- Per-step token statistics that no per-sample partial sum gives exactly (quantiles,
-- correlation, spread), and the count of covered tokens the drift statistics leave out: the
-- rollup behind drift_steps. Written for each step at commit (docs/rollups.md).
-- Grain: one row per training step (run, rollout_id) with at least one token row.
-- Inputs: tokens, drift_tokens; macros drift_covered, drift_finite (sql/macros).
-- Settings: none.
-- Columns (nats unless said otherwise):
--   run                VARCHAR  run name
--   rollout_id         BIGINT   training step
--   nonfinite_tokens   BIGINT   covered tokens with a NaN/inf value (left out of drift_tokens)
--   p50_abs_lp_diff, p90_abs_lp_diff, p99_abs_lp_diff, p999_abs_lp_diff  DOUBLE  quantiles of
--                               |delta| over drift_tokens' rows (quantile_cont, linear)
--   prob_corr          DOUBLE   Pearson correlation of exp(train), exp(rollout) (NaN when
--                               undefined: drift_steps shows it as null)
--   is_ratio_std       DOUBLE   population std of r = exp(delta) (ratio)
CREATE OR REPLACE VIEW drift_step_parts AS
WITH step_counts AS (
    -- The steps with a training token row, and their covered tokens that drift_tokens leaves
    -- out (a count: it needs none of the per-token terms).
    SELECT
        run,
        rollout_id,
        COUNT(*) FILTER (
            WHERE drift_covered(loss_mask, lp_diff)
                AND NOT drift_finite(lp_diff, train_log_prob, rollout_log_prob)
        ) AS nonfinite_tokens
    FROM tokens
    WHERE NOT evaluation
    GROUP BY run, rollout_id
),
token_statistics AS (
    -- Over drift_tokens' rows and its per-token terms (|delta|, the probabilities, r), which
    -- it computes once for every rollup that reads them.
    SELECT
        run,
        rollout_id,
        QUANTILE_CONT(abs_lp_diff, [0.5, 0.9, 0.99, 0.999]) AS abs_quantiles,
        CORR(train_prob, rollout_prob) AS prob_corr,
        STDDEV_POP(ratio) AS is_ratio_std
    FROM drift_tokens
    GROUP BY run, rollout_id
)
SELECT
    c.run::VARCHAR AS run,
    c.rollout_id::BIGINT AS rollout_id,
    c.nonfinite_tokens::BIGINT AS nonfinite_tokens,
    t.abs_quantiles[1]::DOUBLE AS p50_abs_lp_diff,
    t.abs_quantiles[2]::DOUBLE AS p90_abs_lp_diff,
    t.abs_quantiles[3]::DOUBLE AS p99_abs_lp_diff,
    t.abs_quantiles[4]::DOUBLE AS p999_abs_lp_diff,
    t.prob_corr::DOUBLE AS prob_corr,
    t.is_ratio_std::DOUBLE AS is_ratio_std
FROM step_counts AS c
LEFT JOIN token_statistics AS t USING (run, rollout_id)
