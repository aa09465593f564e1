-- Per-sample drift: the sample-level quantities behind the SMTM and sequence-level metrics.
-- Grain: one row per training-step sample with at least one row in drift_tokens
--        (run, rollout_id, evaluation, batch_position; evaluation is always false here, so
--        `JOIN samples USING (run, rollout_id, evaluation, batch_position)` matches the one
--        training sample, never the eval sample of the same position). Samples with no covered
--        finite token are absent.
-- Inputs: drift_sample_parts (the per-sample rollup, computed with drift_settings'
--         log_ratio_clamp, k3_clamp, veto_min_ratio, outlier_min_ratio, outlier_max_ratio,
--         geo_band_low, geo_band_high, seq_ratio_low, seq_ratio_high, icepop_low, icepop_high
--         by the macro sample_drift, which holds every formula below), samples; macro
--         with_sample_properties (sql/macros), which joins the two.
-- Columns:
--   run                    VARCHAR  run name
--   rollout_id             BIGINT   training step
--   batch_position         INTEGER  sample's position in the rollout dump
--   sample_index           BIGINT   Sample.index
--   tokens                 BIGINT   covered finite tokens of the sample
--   sum_lp_diff            DOUBLE   sum of delta (nats) = log of the sequence ratio
--   mean_lp_diff           DOUBLE   mean delta (nats) = log of the geometric-mean ratio
--   mean_abs_lp_diff       DOUBLE   mean |delta| (nats)
--   max_abs_lp_diff        DOUBLE   max |delta| (nats)
--   k3_kl_clamped          DOUBLE   mean of clamp(exp(d) - 1 - d, +-k3_clamp), d = clamp(delta,
--                                   +-log_ratio_clamp) (nats; miles' SMTM k3 per sample)
--   mean_train_log_prob    DOUBLE   mean trainer log-prob (nats)
--   mean_rollout_log_prob  DOUBLE   mean engine log-prob (nats)
--   log_ppl_diff           DOUBLE   mean_rollout_log_prob - mean_train_log_prob
--                                   = log ppl(train) - log ppl(rollout) (nats)
--   chi2_seq_term          DOUBLE   exp(2 clamp(sum_lp_diff, +-log_ratio_clamp)) - 1
--   min_ratio, max_ratio   DOUBLE   smallest / largest r
--   geo_mean_ratio         DOUBLE   exp(mean_lp_diff)
--   seq_ratio              DOUBLE   exp(sum_lp_diff) (may be inf for huge sums)
--   veto_tokens            BIGINT   tokens with r < veto_min_ratio
--   outlier_tokens         BIGINT   tokens with r outside [outlier_min_ratio, outlier_max_ratio]
--   icepop_tokens          BIGINT   tokens with r outside [icepop_low, icepop_high]
--   vetoed                 BOOLEAN  veto_tokens > 0
--   geo_rejected           BOOLEAN  geo_mean_ratio outside [geo_band_low, geo_band_high]
--   seq_ratio_rejected     BOOLEAN  seq_ratio outside [seq_ratio_low, seq_ratio_high]
--   evaluation             BOOLEAN  false: drift is measured on training samples only
--   reward                 DOUBLE   the sample's reward, as samples.reward
--   raw_reward             DOUBLE   as samples.raw_reward (the train files' raw reward)
--   staleness              BIGINT   as samples.staleness (rollout_id - weight_version_min)
CREATE OR REPLACE VIEW drift_samples AS
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
    log_ppl_diff::DOUBLE AS log_ppl_diff,
    chi2_seq_term::DOUBLE AS chi2_seq_term,
    min_ratio::DOUBLE AS min_ratio,
    max_ratio::DOUBLE AS max_ratio,
    geo_mean_ratio::DOUBLE AS geo_mean_ratio,
    seq_ratio::DOUBLE AS seq_ratio,
    veto_tokens::BIGINT AS veto_tokens,
    outlier_tokens::BIGINT AS outlier_tokens,
    icepop_tokens::BIGINT AS icepop_tokens,
    vetoed::BOOLEAN AS vetoed,
    geo_rejected::BOOLEAN AS geo_rejected,
    seq_ratio_rejected::BOOLEAN AS seq_ratio_rejected,
    false AS evaluation,
    reward::DOUBLE AS reward,
    raw_reward::DOUBLE AS raw_reward,
    staleness::BIGINT AS staleness
FROM with_sample_properties(drift_sample_parts)
