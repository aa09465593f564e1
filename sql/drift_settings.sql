-- Thresholds and parameters of every drift view and audit, in one place (one row).
-- Grain: exactly one row.
-- Inputs: none.
-- Override for one session (the catalog is read-only; a TEMP view shadows this one, and every
-- drift view and audit binds `drift_settings` at query time, so they all follow):
--   CREATE OR REPLACE TEMP VIEW drift_settings AS
--   SELECT * REPLACE (3.0::DOUBLE AS is_cap) FROM tokenlake.main.drift_settings;
-- Columns:
--   is_cap                        DOUBLE  importance-weight cap C; weights clamp to [1/C, C] (2.0)
--   veto_min_ratio                DOUBLE  a token with r below this vetoes its sample (1e-4)
--   outlier_min_ratio             DOUBLE  lower edge of the accepted r range (1e-4)
--   outlier_max_ratio             DOUBLE  upper edge of the accepted r range (100)
--   geo_band_low                  DOUBLE  lower edge of the per-sample geometric-mean-r band (0.999)
--   geo_band_high                 DOUBLE  upper edge of that band (1.001)
--   seq_ratio_low                 DOUBLE  lower edge of the per-sample product of r (0.5)
--   seq_ratio_high                DOUBLE  upper edge of the per-sample product of r (2.0)
--   icepop_low                    DOUBLE  lower edge of the per-token icepop band on r (0.5)
--   icepop_high                   DOUBLE  upper edge of the per-token icepop band on r (2.0)
--   log_ratio_clamp               DOUBLE  |delta| clamp of the SMTM k3 and of chi2_seq's sum (20, nats)
--   k3_clamp                      DOUBLE  |k3| clamp of the SMTM k3, as miles logs it (10)
--   outliers_per_step             BIGINT  tokens kept per step by drift_outliers (20)
--   abs_lp_diff_limit             DOUBLE  audit large_lp_diff: |delta| at or above this (20, nats)
--   alarm_mean_abs_lp_diff_smtm   DOUBLE  audit alarm: mean |delta| SMTM above this (0.1, nats)
--   alarm_k3_kl                   DOUBLE  audit alarm: k3 TM above this (1e-3, nats)
--   alarm_mult_prob_error         DOUBLE  audit alarm: mean exp(|delta|) above this (1.05)
--   alarm_ess_min                 DOUBLE  audit alarm: ESS below this (0.3, fraction)
--   alarm_zero_std_group_frac     DOUBLE  audit alarm: zero-std group fraction at or above (0.5)
--   alarm_truncated_frac          DOUBLE  audit alarm: truncated sample fraction at or above (0.25)
CREATE OR REPLACE VIEW drift_settings AS
SELECT
    2.0::DOUBLE AS is_cap,  -- C
    1e-4::DOUBLE AS veto_min_ratio,  -- r below: sample vetoed
    1e-4::DOUBLE AS outlier_min_ratio,  -- r below: outlier
    100.0::DOUBLE AS outlier_max_ratio,  -- r above: outlier
    0.999::DOUBLE AS geo_band_low,  -- exp(mean delta) below: rejected
    1.001::DOUBLE AS geo_band_high,  -- exp(mean delta) above: rejected
    0.5::DOUBLE AS seq_ratio_low,  -- exp(sum delta) below: rejected
    2.0::DOUBLE AS seq_ratio_high,  -- exp(sum delta) above: rejected
    0.5::DOUBLE AS icepop_low,  -- r below: token masked by icepop
    2.0::DOUBLE AS icepop_high,  -- r above: token masked by icepop
    20.0::DOUBLE AS log_ratio_clamp,  -- nats
    10.0::DOUBLE AS k3_clamp,  -- nats
    20::BIGINT AS outliers_per_step,  -- rows per step in drift_outliers
    20.0::DOUBLE AS abs_lp_diff_limit,  -- nats
    0.1::DOUBLE AS alarm_mean_abs_lp_diff_smtm,  -- nats
    1e-3::DOUBLE AS alarm_k3_kl,  -- nats
    1.05::DOUBLE AS alarm_mult_prob_error,  -- ratio
    0.3::DOUBLE AS alarm_ess_min,  -- fraction
    0.5::DOUBLE AS alarm_zero_std_group_frac,  -- fraction
    0.25::DOUBLE AS alarm_truncated_frac  -- fraction
