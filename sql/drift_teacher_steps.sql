-- The student-teacher gap per training step: drift_steps' core statistics over
-- drift_teacher_tokens (delta = student - teacher log-prob) instead of drift_tokens.
-- Grain: one row per training step (run, rollout_id) with at least one teacher token.
-- Inputs: drift_teacher_step_parts (the rollup that computes these rows per step from
--         drift_teacher_tokens).
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
SELECT
    run::VARCHAR AS run,  -- run name
    rollout_id::BIGINT AS rollout_id,  -- training step
    tokens::BIGINT AS tokens,  -- teacher tokens
    samples::BIGINT AS samples,  -- samples
    mean_lp_diff::DOUBLE AS mean_lp_diff,  -- nats
    mean_abs_lp_diff_tm::DOUBLE AS mean_abs_lp_diff_tm,  -- nats
    mean_abs_lp_diff_smtm::DOUBLE AS mean_abs_lp_diff_smtm,  -- nats
    max_abs_lp_diff::DOUBLE AS max_abs_lp_diff,  -- nats
    k1_kl::DOUBLE AS k1_kl,  -- nats
    k2_kl::DOUBLE AS k2_kl,  -- nats
    k3_kl::DOUBLE AS k3_kl,  -- nats
    mult_prob_error::DOUBLE AS mult_prob_error,  -- ratio
    mean_opd_reverse_kl::DOUBLE AS mean_opd_reverse_kl  -- nats
FROM drift_teacher_step_parts
ORDER BY run, rollout_id
