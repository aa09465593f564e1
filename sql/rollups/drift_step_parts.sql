-- Per-step token statistics that no per-sample partial sum gives exactly (quantiles,
-- correlation, spread), and the count of covered tokens the drift statistics leave out: the
-- rollup behind drift_steps. Written for each step at commit (docs/rollups.md).
-- Grain: one row per training step (run, rollout_id) with at least one token row.
-- Inputs: tokens; macros drift_covered, drift_finite (sql/macros).
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
WITH step_tokens AS (
    -- One pass over the training tokens: the covered non-finite count and, over drift_tokens'
    -- rows (the same filter and columns), the statistics a sum per sample cannot give.
    SELECT
        run,
        rollout_id,
        COUNT(*) FILTER (WHERE covered AND NOT finite) AS nonfinite_tokens,
        QUANTILE_CONT(ABS(lp_diff::DOUBLE), [0.5, 0.9, 0.99, 0.999])
            FILTER (WHERE covered AND finite) AS abs_quantiles,
        CORR(EXP(train_log_prob::DOUBLE), EXP(rollout_log_prob::DOUBLE))
            FILTER (WHERE covered AND finite) AS prob_corr,
        STDDEV_POP(EXP(lp_diff::DOUBLE)) FILTER (WHERE covered AND finite) AS is_ratio_std
    FROM (
        SELECT
            run,
            rollout_id,
            lp_diff,
            train_log_prob,
            rollout_log_prob,
            drift_covered(loss_mask, lp_diff) AS covered,
            drift_finite(lp_diff, train_log_prob, rollout_log_prob) AS finite
        FROM tokens
        WHERE NOT evaluation
    )
    GROUP BY run, rollout_id
)
SELECT
    run::VARCHAR AS run,
    rollout_id::BIGINT AS rollout_id,
    nonfinite_tokens::BIGINT AS nonfinite_tokens,
    abs_quantiles[1]::DOUBLE AS p50_abs_lp_diff,
    abs_quantiles[2]::DOUBLE AS p90_abs_lp_diff,
    abs_quantiles[3]::DOUBLE AS p99_abs_lp_diff,
    abs_quantiles[4]::DOUBLE AS p999_abs_lp_diff,
    prob_corr::DOUBLE AS prob_corr,
    is_ratio_std::DOUBLE AS is_ratio_std
FROM step_tokens
