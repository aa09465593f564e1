-- Train/rollout log-prob drift per training step: the metrics verl, slime/miles, NeMo-RL,
-- prime-rl, TRL, OpenRLHF and SkyRL report, computed over the same tokens.
-- Grain: one row per training step (run, rollout_id) that has samples or tokens; a step with no
--        covered finite token has tokens = 0 and null statistics.
-- Notation: delta = train - rollout log-prob over drift_tokens (loss-covered, finite tokens);
--   r = exp(delta); TM = mean over all the step's tokens; SMTM = mean over samples of each
--   sample's token mean (drift_samples); w = clamp(r, 1/C, C) with C = is_cap.
-- Inputs: drift_step_parts (the step's quantiles, correlation, spread and non-finite count),
--         drift_sample_parts (drift_samples' per-sample values with the sample's token sums,
--         computed with drift_settings' is_cap, veto_min_ratio, outlier_min_ratio,
--         outlier_max_ratio, icepop_low, icepop_high, log_ratio_clamp, k3_clamp and the
--         geo/seq_ratio bands), samples, runs (the run's framework), drift_settings (the
--         framework gates' limits); macro ess_fraction (sql/macros).
-- Columns (nats unless said otherwise; docs/drift.md gives every formula and framework name):
--   run                    VARCHAR  run name
--   rollout_id             BIGINT   training step
--   tokens                 BIGINT   covered finite tokens
--   nonfinite_tokens       BIGINT   covered tokens with a NaN/inf value (excluded from stats)
--   samples                BIGINT   samples with at least one covered finite token
--   mean_lp_diff           DOUBLE   TM delta
--   mean_abs_lp_diff_tm    DOUBLE   TM |delta|
--   mean_abs_lp_diff_smtm  DOUBLE   SMTM |delta| (slime/miles train_rollout_logprob_abs_diff)
--   max_abs_lp_diff        DOUBLE   max |delta|
--   p50_abs_lp_diff, p90_abs_lp_diff, p99_abs_lp_diff, p999_abs_lp_diff  DOUBLE  quantiles of
--                                   |delta| (quantile_cont, linear)
--   k1_kl, k2_kl, k3_kl    DOUBLE   TM of -delta, delta^2/2, r - 1 - delta
--   k3_kl_smtm             DOUBLE   SMTM of clamped k3 (drift_samples.k3_kl_clamped)
--   mult_prob_error        DOUBLE   TM exp(|delta|) (ratio)
--   chi2_token             DOUBLE   TM r^2 - 1
--   chi2_seq               DOUBLE   mean over samples of exp(2 clamp(sum delta, +-20)) - 1
--   mean_abs_prob_diff, max_abs_prob_diff  DOUBLE  TM and max of |exp(train) - exp(rollout)|
--                                   (probability)
--   prob_corr              DOUBLE   Pearson correlation of exp(train), exp(rollout); null when
--                                   undefined (fewer than 2 tokens or a constant side)
--   train_mean_log_prob, rollout_mean_log_prob  DOUBLE  SMTM log-prob on each side
--   train_ppl, rollout_ppl DOUBLE   mean over samples of exp(-sample mean log-prob)
--   log_ppl_diff           DOUBLE   mean over samples of log ppl(train) - log ppl(rollout)
--   log_ppl_abs_diff, log_ppl_diff_max, log_ppl_diff_min  DOUBLE  abs-mean / max / min of it
--   ppl_ratio              DOUBLE   mean over samples of ppl(train) / ppl(rollout)
--   is_ratio_mean, is_ratio_std, is_ratio_min, is_ratio_max  DOUBLE  TM / population std /
--                                   min / max of the raw r
--   is_frac_above_cap, is_frac_below_inv_cap  DOUBLE  token fraction r > C, r < 1/C
--   ess                    DOUBLE   1 / TM((w / TM(w))^2) = TM(w)^2 / TM(w^2) (fraction); with
--                                   C = 2 never below 4C^2 / (1 + C^2)^2 = 0.64
--   ess_raw                DOUBLE   the same for the raw ratio r: TM(r)^2 / TM(r^2) (fraction);
--                                   the one the audit drift_alarms watches
--   veto_token_frac, veto_seq_frac  DOUBLE  fraction of the step's tokens a rule removes from
--                                   the loss, and of its samples the rule touches; this rule:
--                                   a sample is rejected if any r < veto_min_ratio
--   outlier_token_frac, outlier_seq_frac  DOUBLE  the same for: token r outside [outlier_min,
--                                   outlier_max]
--   geo_reject_token_frac, geo_reject_seq_frac  DOUBLE  the same for: sample exp(mean delta)
--                                   outside the geo band
--   seq_ratio_reject_token_frac, seq_ratio_reject_seq_frac  DOUBLE  the same for: sample
--                                   exp(sum delta) outside the seq_ratio band
--   icepop_token_frac, icepop_seq_frac  DOUBLE  the same for: token r outside the icepop band
--   prev_rollout_id        BIGINT   the run's previous training step
--   mean_abs_lp_diff_tm_change, mean_abs_lp_diff_smtm_change, k3_kl_change  DOUBLE  the
--                                   value minus the run's previous step's (nats)
--   mult_prob_error_change DOUBLE   the same (ratio)
--   ess_change             DOUBLE   the same (fraction)
--   framework_gate         VARCHAR  the drift metric the run's framework gates its CI on, NULL
--                                   when it publishes none (or the lake did not record it):
--                                   slime 'train/train_rollout_logprob_abs_diff', NeMo-RL
--                                   'train/token_mult_prob_error', miles
--                                   '|rollout/log_probs - rollout/rollout_log_probs|'
--   framework_gate_value   DOUBLE   that metric computed the framework's way: slime SMTM |delta|
--                                   x samples / train_samples (its sum over samples divided by
--                                   the global batch size); NeMo-RL mult_prob_error; miles |SMTM
--                                   delta| x samples / train_samples
--   framework_gate_limit   DOUBLE   the framework's published bound (drift_settings gate_*)
--   framework_gate_passed  BOOLEAN  the framework's rule: slime value <= limit, NeMo-RL value <
--                                   limit, miles value <= limit; NULL without a gate or value
--   train_samples          BIGINT   the step's training samples with a train row, removed ones
--                                   included: the global batch size of one optimizer step
CREATE OR REPLACE VIEW drift_steps AS
WITH step_tokens AS (
    -- The steps that have tokens, with the statistics no per-sample partial sum gives.
    SELECT * FROM drift_step_parts
),
steps AS (
    -- Steps without any token row still get a row (samples lists every step's samples).
    SELECT run, rollout_id, MAX(nonfinite_tokens) AS nonfinite_tokens
    FROM (
        SELECT run, rollout_id, nonfinite_tokens FROM step_tokens
        UNION ALL
        SELECT run, rollout_id, 0 FROM samples WHERE NOT evaluation
    )
    GROUP BY run, rollout_id
),
batch AS (
    -- The samples the step trained on, removed ones included: the denominator slime and miles
    -- divide their sums of per-sample means by (one optimizer step per rollout).
    SELECT run, rollout_id, COUNT(*) FILTER (WHERE has_train_row) AS train_samples
    FROM samples
    WHERE NOT evaluation
    GROUP BY run, rollout_id
),
per_sample AS (
    -- One pass over drift_tokens: drift_samples' rows (the same macro, so the same formulas)
    -- with the sample's sums of per-token values, added up per step below into the token means.
    -- Reading drift_samples and drift_tokens separately would read every token twice.
    SELECT * FROM drift_sample_parts
),
step_level AS (
    SELECT
        run,
        rollout_id,
        SUM(tokens) AS tokens,
        COUNT(*) AS samples,
        SUM(sum_lp_diff) / SUM(tokens) AS mean_lp_diff,
        SUM(abs_lp_diff_sum) / SUM(tokens) AS mean_abs_lp_diff_tm,
        AVG(mean_abs_lp_diff) AS mean_abs_lp_diff_smtm,
        MAX(max_abs_lp_diff) AS max_abs_lp_diff,
        -SUM(sum_lp_diff) / SUM(tokens) AS k1_kl,
        SUM(k2_sum) / SUM(tokens) AS k2_kl,
        SUM(k3_sum) / SUM(tokens) AS k3_kl,
        AVG(k3_kl_clamped) AS k3_kl_smtm,
        SUM(exp_abs_lp_diff_sum) / SUM(tokens) AS mult_prob_error,
        SUM(ratio_sq_sum) / SUM(tokens) - 1.0 AS chi2_token,
        AVG(chi2_seq_term) AS chi2_seq,
        SUM(abs_prob_diff_sum) / SUM(tokens) AS mean_abs_prob_diff,
        MAX(max_abs_prob_diff) AS max_abs_prob_diff,
        AVG(mean_train_log_prob) AS train_mean_log_prob,
        AVG(mean_rollout_log_prob) AS rollout_mean_log_prob,
        AVG(EXP(-mean_train_log_prob)) AS train_ppl,
        AVG(EXP(-mean_rollout_log_prob)) AS rollout_ppl,
        AVG(log_ppl_diff) AS log_ppl_diff,
        AVG(ABS(log_ppl_diff)) AS log_ppl_abs_diff,
        MAX(log_ppl_diff) AS log_ppl_diff_max,
        MIN(log_ppl_diff) AS log_ppl_diff_min,
        AVG(EXP(log_ppl_diff)) AS ppl_ratio,
        SUM(ratio_sum) / SUM(tokens) AS is_ratio_mean,
        MIN(min_ratio) AS is_ratio_min,
        MAX(max_ratio) AS is_ratio_max,
        SUM(above_cap_tokens)::DOUBLE / SUM(tokens) AS is_frac_above_cap,
        SUM(below_inv_cap_tokens)::DOUBLE / SUM(tokens) AS is_frac_below_inv_cap,
        ess_fraction(SUM(w_sum) / SUM(tokens), SUM(w_sq_sum) / SUM(tokens)) AS ess,
        ess_fraction(SUM(ratio_sum) / SUM(tokens), SUM(ratio_sq_sum) / SUM(tokens)) AS ess_raw,
        COALESCE(SUM(tokens) FILTER (WHERE vetoed), 0)::DOUBLE / SUM(tokens) AS veto_token_frac,
        AVG(vetoed::INTEGER) AS veto_seq_frac,
        SUM(outlier_tokens)::DOUBLE / SUM(tokens) AS outlier_token_frac,
        AVG((outlier_tokens > 0)::INTEGER) AS outlier_seq_frac,
        COALESCE(SUM(tokens) FILTER (WHERE geo_rejected), 0)::DOUBLE / SUM(tokens)
            AS geo_reject_token_frac,
        AVG(geo_rejected::INTEGER) AS geo_reject_seq_frac,
        COALESCE(SUM(tokens) FILTER (WHERE seq_ratio_rejected), 0)::DOUBLE / SUM(tokens)
            AS seq_ratio_reject_token_frac,
        AVG(seq_ratio_rejected::INTEGER) AS seq_ratio_reject_seq_frac,
        SUM(icepop_tokens)::DOUBLE / SUM(tokens) AS icepop_token_frac,
        AVG((icepop_tokens > 0)::INTEGER) AS icepop_seq_frac
    FROM per_sample
    GROUP BY run, rollout_id
),
joined AS (
    SELECT
        st.run,
        st.rollout_id,
        COALESCE(sl.tokens, 0) AS tokens,
        st.nonfinite_tokens,
        COALESCE(sl.samples, 0) AS samples,
        sl.* EXCLUDE (run, rollout_id, tokens, samples),
        tl.p50_abs_lp_diff,
        tl.p90_abs_lp_diff,
        tl.p99_abs_lp_diff,
        tl.p999_abs_lp_diff,
        CASE WHEN ISNAN(tl.prob_corr) THEN NULL ELSE tl.prob_corr END AS prob_corr,
        tl.is_ratio_std,
        LAG(st.rollout_id) OVER run_steps AS prev_rollout_id,
        sl.mean_abs_lp_diff_tm - LAG(sl.mean_abs_lp_diff_tm) OVER run_steps
            AS mean_abs_lp_diff_tm_change,
        sl.mean_abs_lp_diff_smtm - LAG(sl.mean_abs_lp_diff_smtm) OVER run_steps
            AS mean_abs_lp_diff_smtm_change,
        sl.k3_kl - LAG(sl.k3_kl) OVER run_steps AS k3_kl_change,
        sl.mult_prob_error - LAG(sl.mult_prob_error) OVER run_steps AS mult_prob_error_change,
        sl.ess - LAG(sl.ess) OVER run_steps AS ess_change,
        COALESCE(b.train_samples, 0) AS train_samples,
        r.framework
    FROM steps AS st
    LEFT JOIN step_level AS sl USING (run, rollout_id)
    LEFT JOIN step_tokens AS tl USING (run, rollout_id)
    LEFT JOIN batch AS b USING (run, rollout_id)
    LEFT JOIN runs AS r ON r.run = st.run
    WINDOW run_steps AS (PARTITION BY st.run ORDER BY st.rollout_id)
),
gated AS (
    -- Each framework's published drift gate, computed the way that framework logs it
    -- (docs/drift.md, "Each run by its own framework's gate").
    SELECT
        j.*,
        CASE j.framework
            WHEN 'slime' THEN 'train/train_rollout_logprob_abs_diff'
            WHEN 'nemo-rl' THEN 'train/token_mult_prob_error'
            WHEN 'miles' THEN '|rollout/log_probs - rollout/rollout_log_probs|'
        END AS framework_gate,
        CASE j.framework
            WHEN 'slime' THEN j.mean_abs_lp_diff_smtm * j.samples / j.train_samples
            WHEN 'nemo-rl' THEN j.mult_prob_error
            WHEN 'miles' THEN
                ABS(j.train_mean_log_prob - j.rollout_mean_log_prob) * j.samples / j.train_samples
        END AS framework_gate_value,
        CASE j.framework
            WHEN 'slime' THEN s.gate_slime_abs_diff
            WHEN 'nemo-rl' THEN s.gate_nemo_rl_mult_prob_error
            WHEN 'miles' THEN s.gate_miles_log_prob_diff
        END AS framework_gate_limit
    FROM joined AS j
    CROSS JOIN drift_settings AS s
)
SELECT
    run::VARCHAR AS run,
    rollout_id::BIGINT AS rollout_id,
    tokens::BIGINT AS tokens,
    nonfinite_tokens::BIGINT AS nonfinite_tokens,
    samples::BIGINT AS samples,
    mean_lp_diff::DOUBLE AS mean_lp_diff,
    mean_abs_lp_diff_tm::DOUBLE AS mean_abs_lp_diff_tm,
    mean_abs_lp_diff_smtm::DOUBLE AS mean_abs_lp_diff_smtm,
    max_abs_lp_diff::DOUBLE AS max_abs_lp_diff,
    p50_abs_lp_diff::DOUBLE AS p50_abs_lp_diff,
    p90_abs_lp_diff::DOUBLE AS p90_abs_lp_diff,
    p99_abs_lp_diff::DOUBLE AS p99_abs_lp_diff,
    p999_abs_lp_diff::DOUBLE AS p999_abs_lp_diff,
    k1_kl::DOUBLE AS k1_kl,
    k2_kl::DOUBLE AS k2_kl,
    k3_kl::DOUBLE AS k3_kl,
    k3_kl_smtm::DOUBLE AS k3_kl_smtm,
    mult_prob_error::DOUBLE AS mult_prob_error,
    chi2_token::DOUBLE AS chi2_token,
    chi2_seq::DOUBLE AS chi2_seq,
    mean_abs_prob_diff::DOUBLE AS mean_abs_prob_diff,
    max_abs_prob_diff::DOUBLE AS max_abs_prob_diff,
    prob_corr::DOUBLE AS prob_corr,
    train_mean_log_prob::DOUBLE AS train_mean_log_prob,
    rollout_mean_log_prob::DOUBLE AS rollout_mean_log_prob,
    train_ppl::DOUBLE AS train_ppl,
    rollout_ppl::DOUBLE AS rollout_ppl,
    log_ppl_diff::DOUBLE AS log_ppl_diff,
    log_ppl_abs_diff::DOUBLE AS log_ppl_abs_diff,
    log_ppl_diff_max::DOUBLE AS log_ppl_diff_max,
    log_ppl_diff_min::DOUBLE AS log_ppl_diff_min,
    ppl_ratio::DOUBLE AS ppl_ratio,
    is_ratio_mean::DOUBLE AS is_ratio_mean,
    is_ratio_std::DOUBLE AS is_ratio_std,
    is_ratio_min::DOUBLE AS is_ratio_min,
    is_ratio_max::DOUBLE AS is_ratio_max,
    is_frac_above_cap::DOUBLE AS is_frac_above_cap,
    is_frac_below_inv_cap::DOUBLE AS is_frac_below_inv_cap,
    ess::DOUBLE AS ess,
    ess_raw::DOUBLE AS ess_raw,
    veto_token_frac::DOUBLE AS veto_token_frac,
    veto_seq_frac::DOUBLE AS veto_seq_frac,
    outlier_token_frac::DOUBLE AS outlier_token_frac,
    outlier_seq_frac::DOUBLE AS outlier_seq_frac,
    geo_reject_token_frac::DOUBLE AS geo_reject_token_frac,
    geo_reject_seq_frac::DOUBLE AS geo_reject_seq_frac,
    seq_ratio_reject_token_frac::DOUBLE AS seq_ratio_reject_token_frac,
    seq_ratio_reject_seq_frac::DOUBLE AS seq_ratio_reject_seq_frac,
    icepop_token_frac::DOUBLE AS icepop_token_frac,
    icepop_seq_frac::DOUBLE AS icepop_seq_frac,
    prev_rollout_id::BIGINT AS prev_rollout_id,
    mean_abs_lp_diff_tm_change::DOUBLE AS mean_abs_lp_diff_tm_change,
    mean_abs_lp_diff_smtm_change::DOUBLE AS mean_abs_lp_diff_smtm_change,
    k3_kl_change::DOUBLE AS k3_kl_change,
    mult_prob_error_change::DOUBLE AS mult_prob_error_change,
    ess_change::DOUBLE AS ess_change,
    framework_gate::VARCHAR AS framework_gate,
    framework_gate_value::DOUBLE AS framework_gate_value,
    framework_gate_limit::DOUBLE AS framework_gate_limit,
    CASE
        WHEN framework = 'nemo-rl' THEN framework_gate_value < framework_gate_limit
        ELSE framework_gate_value <= framework_gate_limit
    END::BOOLEAN AS framework_gate_passed,
    train_samples::BIGINT AS train_samples
FROM gated
ORDER BY run, rollout_id
