-- Per-sample drift partials: the rollup behind drift_samples, drift_steps and every per-sample
-- breakdown. Written for each step at commit (docs/rollups.md); a query under other
-- drift_settings than the stored rows were computed with reads them from the tokens instead.
-- Grain: one row per training-step sample with at least one row in drift_tokens
--        (run, rollout_id, batch_position).
-- Inputs: drift_tokens, drift_settings; macro sample_drift (sql/macros), which holds every
--         formula below.
-- Settings: is_cap, veto_min_ratio, outlier_min_ratio, outlier_max_ratio, geo_band_low,
--           geo_band_high, seq_ratio_low, seq_ratio_high, icepop_low, icepop_high,
--           log_ratio_clamp, k3_clamp.
-- Notation: drift_samples gives each per-sample formula and unit; r = ratio,
--   w = clamp_to(r, 1 / is_cap, is_cap).
-- Columns:
--   run                    VARCHAR  run name
--   rollout_id             BIGINT   training step
--   batch_position         INTEGER  sample's position in the rollout dump
--   sample_index           BIGINT   Sample.index
--   tokens                 BIGINT   covered finite tokens of the sample
--   sum_lp_diff            DOUBLE   sum of delta (nats)
--   mean_lp_diff           DOUBLE   mean delta (nats)
--   mean_abs_lp_diff       DOUBLE   mean |delta| (nats)
--   max_abs_lp_diff        DOUBLE   max |delta| (nats)
--   k3_kl_clamped          DOUBLE   mean clamped k3 (nats)
--   mean_train_log_prob    DOUBLE   mean trainer log-prob (nats)
--   mean_rollout_log_prob  DOUBLE   mean engine log-prob (nats)
--   min_ratio, max_ratio   DOUBLE   smallest / largest r
--   veto_tokens            BIGINT   tokens with r < veto_min_ratio
--   outlier_tokens         BIGINT   tokens with r outside [outlier_min_ratio, outlier_max_ratio]
--   icepop_tokens          BIGINT   tokens with r outside [icepop_low, icepop_high]
--   abs_lp_diff_sum        DOUBLE   sum of |delta| (nats)
--   k2_sum                 DOUBLE   sum of delta^2 / 2 (nats)
--   k3_sum                 DOUBLE   sum of r - 1 - delta (nats)
--   exp_abs_lp_diff_sum    DOUBLE   sum of exp(|delta|)
--   ratio_sum              DOUBLE   sum of r
--   ratio_sq_sum           DOUBLE   sum of r^2
--   w_sum                  DOUBLE   sum of w
--   w_sq_sum               DOUBLE   sum of w^2
--   abs_prob_diff_sum      DOUBLE   sum of |exp(train) - exp(rollout)| (probability)
--   max_abs_prob_diff      DOUBLE   max of it
--   above_cap_tokens       BIGINT   tokens with r > is_cap
--   below_inv_cap_tokens   BIGINT   tokens with r < 1 / is_cap
--   geo_mean_ratio         DOUBLE   exp(mean_lp_diff)
--   seq_ratio              DOUBLE   exp(sum_lp_diff)
--   log_ppl_diff           DOUBLE   mean_rollout_log_prob - mean_train_log_prob (nats)
--   chi2_seq_term          DOUBLE   exp(2 clamp(sum_lp_diff, +-log_ratio_clamp)) - 1
--   vetoed                 BOOLEAN  veto_tokens > 0
--   geo_rejected           BOOLEAN  geo_mean_ratio outside [geo_band_low, geo_band_high]
--   seq_ratio_rejected     BOOLEAN  seq_ratio outside [seq_ratio_low, seq_ratio_high]
CREATE OR REPLACE VIEW drift_sample_parts AS
SELECT
    run::VARCHAR AS run,
    rollout_id::BIGINT AS rollout_id,
    batch_position::INTEGER AS batch_position,
    sample_index::BIGINT AS sample_index,
    tokens::BIGINT AS tokens,
    sum_lp_diff::DOUBLE AS sum_lp_diff,
    mean_lp_diff::DOUBLE AS mean_lp_diff,
    mean_abs_lp_diff::DOUBLE AS mean_abs_lp_diff,
    max_abs_lp_diff::DOUBLE AS max_abs_lp_diff,
    k3_kl_clamped::DOUBLE AS k3_kl_clamped,
    mean_train_log_prob::DOUBLE AS mean_train_log_prob,
    mean_rollout_log_prob::DOUBLE AS mean_rollout_log_prob,
    min_ratio::DOUBLE AS min_ratio,
    max_ratio::DOUBLE AS max_ratio,
    veto_tokens::BIGINT AS veto_tokens,
    outlier_tokens::BIGINT AS outlier_tokens,
    icepop_tokens::BIGINT AS icepop_tokens,
    abs_lp_diff_sum::DOUBLE AS abs_lp_diff_sum,
    k2_sum::DOUBLE AS k2_sum,
    k3_sum::DOUBLE AS k3_sum,
    exp_abs_lp_diff_sum::DOUBLE AS exp_abs_lp_diff_sum,
    ratio_sum::DOUBLE AS ratio_sum,
    ratio_sq_sum::DOUBLE AS ratio_sq_sum,
    w_sum::DOUBLE AS w_sum,
    w_sq_sum::DOUBLE AS w_sq_sum,
    abs_prob_diff_sum::DOUBLE AS abs_prob_diff_sum,
    max_abs_prob_diff::DOUBLE AS max_abs_prob_diff,
    above_cap_tokens::BIGINT AS above_cap_tokens,
    below_inv_cap_tokens::BIGINT AS below_inv_cap_tokens,
    geo_mean_ratio::DOUBLE AS geo_mean_ratio,
    seq_ratio::DOUBLE AS seq_ratio,
    log_ppl_diff::DOUBLE AS log_ppl_diff,
    chi2_seq_term::DOUBLE AS chi2_seq_term,
    vetoed::BOOLEAN AS vetoed,
    geo_rejected::BOOLEAN AS geo_rejected,
    seq_ratio_rejected::BOOLEAN AS seq_ratio_rejected
FROM sample_drift(drift_tokens, drift_settings)
