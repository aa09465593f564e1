-- The student-teacher gap per training step: drift_steps' core statistics over
-- drift_teacher_tokens (delta = student - teacher log-prob) instead of drift_tokens.
-- Grain: one row per training step (run, rollout_id) with at least one teacher token.
-- Inputs: drift_teacher_tokens.
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
CREATE OR REPLACE VIEW drift_teacher_steps AS
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
    p.run::VARCHAR AS run,  -- run name
    p.rollout_id::BIGINT AS rollout_id,  -- training step
    p.tokens::BIGINT AS tokens,  -- teacher tokens
    p.samples::BIGINT AS samples,  -- samples
    p.mean_lp_diff::DOUBLE AS mean_lp_diff,  -- nats
    p.mean_abs_lp_diff_tm::DOUBLE AS mean_abs_lp_diff_tm,  -- nats
    s.mean_abs_lp_diff_smtm::DOUBLE AS mean_abs_lp_diff_smtm,  -- nats
    p.max_abs_lp_diff::DOUBLE AS max_abs_lp_diff,  -- nats
    p.k1_kl::DOUBLE AS k1_kl,  -- nats
    p.k2_kl::DOUBLE AS k2_kl,  -- nats
    p.k3_kl::DOUBLE AS k3_kl,  -- nats
    p.mult_prob_error::DOUBLE AS mult_prob_error,  -- ratio
    p.mean_opd_reverse_kl::DOUBLE AS mean_opd_reverse_kl  -- nats
FROM per_step AS p
JOIN (
    SELECT run, rollout_id, AVG(sample_mean_abs) AS mean_abs_lp_diff_smtm
    FROM per_sample
    GROUP BY run, rollout_id
) AS s USING (run, rollout_id)
ORDER BY run, rollout_id
