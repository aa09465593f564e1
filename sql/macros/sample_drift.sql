-- The per-sample drift formulas, written once, as the DuckDB table macro sample_drift: the
-- view drift_samples selects its columns from it, and drift_steps rolls its rows up per step.
--
-- sample_drift(toks, settings): `toks` names a relation with drift_tokens' rows and columns
-- (the view, or a CTE over it), `settings` one with drift_settings' single row (log_ratio_clamp,
-- k3_clamp, veto_min_ratio, outlier_min_ratio, outlier_max_ratio, geo_band_low, geo_band_high,
-- seq_ratio_low, seq_ratio_high, icepop_low, icepop_high, is_cap); macros clamp_abs, clamp_to,
-- k3_term (drift_macros.sql).
-- Grain: one row per (run, rollout_id, batch_position) with at least one row in `toks`.
-- Columns: drift_samples' own (sql/drift_samples.sql gives each formula and unit): run,
--   rollout_id, batch_position, sample_index, tokens, sum_lp_diff, mean_lp_diff,
--   mean_abs_lp_diff, max_abs_lp_diff, k3_kl_clamped, mean_train_log_prob,
--   mean_rollout_log_prob, log_ppl_diff, chi2_seq_term, min_ratio, max_ratio, geo_mean_ratio,
--   seq_ratio, veto_tokens, outlier_tokens, icepop_tokens, vetoed, geo_rejected,
--   seq_ratio_rejected; and the sample's sums of per-token values that drift_steps adds up
--   into token means (TM) of the step (r = ratio, w = clamp_to(r, 1 / is_cap, is_cap)):
--   abs_lp_diff_sum (|delta|), k2_sum (delta^2 / 2), k3_sum (k3), exp_abs_lp_diff_sum
--   (exp(|delta|)), ratio_sum (r), ratio_sq_sum (r^2), w_sum (w), w_sq_sum (w^2),
--   abs_prob_diff_sum (abs_prob_diff), max_abs_prob_diff (their max), above_cap_tokens
--   (r > is_cap), below_inv_cap_tokens (r < 1 / is_cap).
-- A view that selects only some columns pays only for those: DuckDB drops unused aggregates.
CREATE OR REPLACE MACRO sample_drift(toks, settings) AS TABLE
WITH per_sample AS (
    SELECT
        t.run,
        t.rollout_id,
        t.batch_position,
        ANY_VALUE(t.sample_index) AS sample_index,
        COUNT(*) AS tokens,
        SUM(t.lp_diff) AS sum_lp_diff,
        AVG(t.lp_diff) AS mean_lp_diff,
        AVG(t.abs_lp_diff) AS mean_abs_lp_diff,
        MAX(t.abs_lp_diff) AS max_abs_lp_diff,
        -- Within the clamp, clamp_abs leaves delta as it is and k3_term(delta) is toks.k3:
        -- the same value without a second exp() per token.
        AVG(clamp_abs(
            CASE
                WHEN t.abs_lp_diff <= s.log_ratio_clamp THEN t.k3
                ELSE k3_term(clamp_abs(t.lp_diff, s.log_ratio_clamp))
            END,
            s.k3_clamp
        )) AS k3_kl_clamped,
        AVG(t.train_log_prob) AS mean_train_log_prob,
        AVG(t.rollout_log_prob) AS mean_rollout_log_prob,
        MIN(t.ratio) AS min_ratio,
        MAX(t.ratio) AS max_ratio,
        COUNT(*) FILTER (WHERE t.ratio < s.veto_min_ratio) AS veto_tokens,
        COUNT(*) FILTER (
            WHERE t.ratio < s.outlier_min_ratio OR t.ratio > s.outlier_max_ratio
        ) AS outlier_tokens,
        COUNT(*) FILTER (WHERE t.ratio < s.icepop_low OR t.ratio > s.icepop_high) AS icepop_tokens,
        SUM(t.abs_lp_diff) AS abs_lp_diff_sum,
        SUM(t.lp_diff * t.lp_diff * 0.5) AS k2_sum,
        SUM(t.k3) AS k3_sum,
        SUM(EXP(t.abs_lp_diff)) AS exp_abs_lp_diff_sum,
        SUM(t.ratio) AS ratio_sum,
        SUM(t.ratio * t.ratio) AS ratio_sq_sum,
        SUM(clamp_to(t.ratio, 1.0 / s.is_cap, s.is_cap)) AS w_sum,
        SUM(POWER(clamp_to(t.ratio, 1.0 / s.is_cap, s.is_cap), 2)) AS w_sq_sum,
        SUM(t.abs_prob_diff) AS abs_prob_diff_sum,
        MAX(t.abs_prob_diff) AS max_abs_prob_diff,
        COUNT(*) FILTER (WHERE t.ratio > s.is_cap) AS above_cap_tokens,
        COUNT(*) FILTER (WHERE t.ratio < 1.0 / s.is_cap) AS below_inv_cap_tokens
    FROM query_table(toks) AS t
    CROSS JOIN query_table(settings) AS s
    GROUP BY t.run, t.rollout_id, t.batch_position
),
ratios AS (
    SELECT
        p.*,
        EXP(p.mean_lp_diff) AS geo_mean_ratio,
        EXP(p.sum_lp_diff) AS seq_ratio
    FROM per_sample AS p
)
SELECT
    p.*,
    p.mean_rollout_log_prob - p.mean_train_log_prob AS log_ppl_diff,
    EXP(2.0 * clamp_abs(p.sum_lp_diff, s.log_ratio_clamp)) - 1.0 AS chi2_seq_term,
    p.veto_tokens > 0 AS vetoed,
    p.geo_mean_ratio NOT BETWEEN s.geo_band_low AND s.geo_band_high AS geo_rejected,
    p.seq_ratio NOT BETWEEN s.seq_ratio_low AND s.seq_ratio_high AS seq_ratio_rejected
FROM ratios AS p
CROSS JOIN query_table(settings) AS s;
