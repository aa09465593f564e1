-- Thresholds and parameters of every drift view and audit, in one place (one row).
-- Grain: exactly one row.
-- Inputs: none.
-- Override for one session (the catalog is read-only; a TEMP view shadows this one, and every
-- drift view and audit binds `drift_settings` at query time, so they all follow):
--   CREATE OR REPLACE TEMP VIEW drift_settings AS
--   SELECT * REPLACE (3.0::DOUBLE AS is_cap) FROM tokenlake.main.drift_settings;
-- Columns:
--   is_cap                       DOUBLE   importance-weight cap C; weights clamp to [1/C, C] (2.0)
--   veto_min_ratio               DOUBLE   a token with r below this vetoes its sample (1e-4)
--   outlier_min_ratio            DOUBLE   lower edge of the accepted r range (1e-4)
--   outlier_max_ratio            DOUBLE   upper edge of the accepted r range (100)
--   geo_band_low                 DOUBLE   lower edge of the per-sample geometric-mean-r band
--                                         (0.999)
--   geo_band_high                DOUBLE   upper edge of that band (1.001)
--   seq_ratio_low                DOUBLE   lower edge of the per-sample product of r (0.5)
--   seq_ratio_high               DOUBLE   upper edge of the per-sample product of r (2.0)
--   icepop_low                   DOUBLE   lower edge of the per-token icepop band on r (0.5)
--   icepop_high                  DOUBLE   upper edge of the per-token icepop band on r (2.0)
--   log_ratio_clamp              DOUBLE   |delta| clamp of the SMTM k3 and of chi2_seq's sum (20,
--                                         nats)
--   k3_clamp                     DOUBLE   |k3| clamp of the SMTM k3, as miles logs it (10)
--   outliers_per_step            BIGINT   tokens kept per step by drift_outliers (20)
--   histogram_half_width         DOUBLE   drift_histogram's bins cover [-this, this) in 100 bins
--                                         (0.1 nats; the report sets it from the data)
--   abs_lp_diff_limit            DOUBLE   audit large_lp_diff: |delta| at or above this (20, nats)
--   alarm_mean_abs_lp_diff_smtm  DOUBLE   drift_alarms: mean |delta| SMTM above this (0.1, nats;
--                                         slime's CI gate on train_rollout_logprob_abs_diff)
--   alarm_k3_kl                  DOUBLE   drift_alarms: k3 TM above this (0.01, nats; Gaussian drift
--                                         at slime's gate has k3 0.008; docs/drift.md)
--   alarm_mult_prob_error        DOUBLE   drift_alarms: mean exp(|delta|) above this (1.05, ratio;
--                                         NeMo-RL's threshold on token_mult_prob_error)
--   alarm_ess_min                DOUBLE   drift_alarms: ess_raw below this (0.3, fraction)
--   alarm_zero_std_group_frac    DOUBLE   zero_std_groups: zero-std share of the groups with
--                                         reward data at or above this (0.5, the dashboard's)
--   alarm_truncated_frac         DOUBLE   truncated_steps: truncated sample fraction at or above
--                                         this (0.25, the dashboard's)
--   alarm_beyond_ln2_frac        DOUBLE   tokens_beyond_ln2: share of a step's drift tokens with
--                                         |delta| > ln 2 above this (0.01, fraction)
--   gate_slime_abs_diff          DOUBLE   framework_gates: slime's --ci-test bound on
--                                         train/train_rollout_logprob_abs_diff (0.1, nats)
--   gate_nemo_rl_mult_prob_error DOUBLE   framework_gates: NeMo-RL's functional tests' bound on
--                                         train/token_mult_prob_error, which must stay below it
--                                         (1.05, ratio)
--   gate_miles_log_prob_diff     DOUBLE   framework_gates: miles' --ci-test tolerance between
--                                         rollout/log_probs and rollout/rollout_log_probs (0.03,
--                                         nats)
--   shift_min_corr               DOUBLE   shifted_log_probs: the correlation with a neighbour's
--                                         rollout log-prob that counts as tracking it (0.9)
--   shift_min_tokens             BIGINT   shifted_log_probs: pairs a step needs to be judged (32)
CREATE OR REPLACE VIEW drift_settings AS
SELECT
    2.0::DOUBLE AS is_cap,
    1e-4::DOUBLE AS veto_min_ratio,
    1e-4::DOUBLE AS outlier_min_ratio,
    100.0::DOUBLE AS outlier_max_ratio,
    0.999::DOUBLE AS geo_band_low,
    1.001::DOUBLE AS geo_band_high,
    0.5::DOUBLE AS seq_ratio_low,
    2.0::DOUBLE AS seq_ratio_high,
    0.5::DOUBLE AS icepop_low,
    2.0::DOUBLE AS icepop_high,
    20.0::DOUBLE AS log_ratio_clamp,
    10.0::DOUBLE AS k3_clamp,
    20::BIGINT AS outliers_per_step,
    0.1::DOUBLE AS histogram_half_width,
    20.0::DOUBLE AS abs_lp_diff_limit,
    0.1::DOUBLE AS alarm_mean_abs_lp_diff_smtm,
    0.01::DOUBLE AS alarm_k3_kl,
    1.05::DOUBLE AS alarm_mult_prob_error,
    0.3::DOUBLE AS alarm_ess_min,
    0.5::DOUBLE AS alarm_zero_std_group_frac,
    0.25::DOUBLE AS alarm_truncated_frac,
    0.01::DOUBLE AS alarm_beyond_ln2_frac,
    0.1::DOUBLE AS gate_slime_abs_diff,
    1.05::DOUBLE AS gate_nemo_rl_mult_prob_error,
    0.03::DOUBLE AS gate_miles_log_prob_diff,
    0.9::DOUBLE AS shift_min_corr,
    32::BIGINT AS shift_min_tokens
