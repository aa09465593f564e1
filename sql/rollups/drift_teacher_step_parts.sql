-- drift_teacher_steps' rows: the student-teacher gap statistics of each training step over
-- drift_teacher_tokens. Every statistic is within one step, so the rollup holds the final
-- values and the view only orders them.
-- Grain: one row per training step (run, rollout_id) with at least one teacher token.
-- Inputs: drift_teacher_tokens.
-- Settings: none.
-- Columns (nats unless said otherwise):
--   run                    VARCHAR  run name
--   rollout_id             BIGINT   training step
--   tokens                 BIGINT   teacher tokens (loss-covered, both log-probs finite)
--   samples                BIGINT   samples with such a token
--   mean_lp_diff           DOUBLE   token mean of delta
--   mean_abs_lp_diff_tm    DOUBLE   token mean of |delta|
--   mean_abs_lp_diff_smtm  DOUBLE   mean over samples of each sample's token mean |delta|
--   max_abs_lp_diff        DOUBLE   max |delta|
--   k1_kl                  DOUBLE   token mean of -delta
--   k2_kl                  DOUBLE   token mean of delta^2/2
--   k3_kl                  DOUBLE   token mean of r - 1 - delta
--   mult_prob_error        DOUBLE   token mean of exp(|delta|) (ratio)
--   mean_opd_reverse_kl    DOUBLE   token mean of the writer's reverse-KL estimate; null when
--                                   it was not dumped
CREATE OR REPLACE VIEW drift_teacher_step_parts AS
WITH per_sample AS (
    SELECT
        run,
        rollout_id,
        batch_position,
        AVG(abs_lp_diff) AS sample_mean_abs
    FROM drift_teacher_tokens
    GROUP BY run, rollout_id, batch_position
),
per_step AS (
    SELECT
        run,
        rollout_id,
        COUNT(*) AS tokens,
        COUNT(DISTINCT batch_position) AS samples,
        AVG(lp_diff) AS mean_lp_diff,
        AVG(abs_lp_diff) AS mean_abs_lp_diff_tm,
        MAX(abs_lp_diff) AS max_abs_lp_diff,
        AVG(-lp_diff) AS k1_kl,
        AVG(lp_diff * lp_diff / 2) AS k2_kl,
        AVG(k3) AS k3_kl,
        AVG(EXP(abs_lp_diff)) AS mult_prob_error,
        AVG(opd_reverse_kl) AS mean_opd_reverse_kl
    FROM drift_teacher_tokens
    GROUP BY run, rollout_id
)
SELECT
    p.run::VARCHAR AS run,
    p.rollout_id::BIGINT AS rollout_id,
    p.tokens::BIGINT AS tokens,
    p.samples::BIGINT AS samples,
    p.mean_lp_diff::DOUBLE AS mean_lp_diff,
    p.mean_abs_lp_diff_tm::DOUBLE AS mean_abs_lp_diff_tm,
    s.mean_abs_lp_diff_smtm::DOUBLE AS mean_abs_lp_diff_smtm,
    p.max_abs_lp_diff::DOUBLE AS max_abs_lp_diff,
    p.k1_kl::DOUBLE AS k1_kl,
    p.k2_kl::DOUBLE AS k2_kl,
    p.k3_kl::DOUBLE AS k3_kl,
    p.mult_prob_error::DOUBLE AS mult_prob_error,
    p.mean_opd_reverse_kl::DOUBLE AS mean_opd_reverse_kl
FROM per_step AS p
JOIN (
    SELECT run, rollout_id, AVG(sample_mean_abs) AS mean_abs_lp_diff_smtm
    FROM per_sample
    GROUP BY run, rollout_id
) AS s USING (run, rollout_id)
