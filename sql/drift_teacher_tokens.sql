-- The student-teacher gap of on-policy distillation, token by token: the second drift, the
-- trainer (student) against the teacher instead of against the rollout engine.
-- Grain: one row per loss-covered token of a training step with a finite student and teacher
--        log-prob (run, rollout_id, batch_position, position); no rows in runs without a
--        teacher (tokens.teacher_log_prob NULL).
-- Inputs: trained_tokens (the training tokens under the loss); macro k3_term (sql/macros).
-- Columns:
--   run               VARCHAR  run name
--   rollout_id        BIGINT   training step
--   batch_position    INTEGER  sample's position in the rollout dump
--   sample_index      BIGINT   Sample.index
--   position          INTEGER  0-based response position
--   token_id          BIGINT   token id
--   turn_index        INTEGER  0-based loss-covered run of the response, as in `tokens`
--   train_log_prob    DOUBLE   student (trainer) log-prob (nats)
--   teacher_log_prob  DOUBLE   teacher log-prob (nats)
--   opd_reverse_kl    DOUBLE   the writer's precomputed reverse-KL estimate, null if not dumped
--   lp_diff           DOUBLE   delta = student - teacher (nats)
--   abs_lp_diff       DOUBLE   |delta| (nats)
--   ratio             DOUBLE   r = exp(delta)
--   k3                DOUBLE   r - 1 - delta (nats)
CREATE OR REPLACE VIEW drift_teacher_tokens AS
WITH covered AS (
    SELECT
        run,
        rollout_id,
        batch_position,
        sample_index,
        position,
        token_id,
        turn_index,
        train_log_prob::DOUBLE AS student_lp,
        teacher_log_prob::DOUBLE AS teacher_lp,
        opd_reverse_kl::DOUBLE AS opd_reverse_kl
    FROM trained_tokens
    WHERE ISFINITE(train_log_prob)
        AND ISFINITE(teacher_log_prob)
)
SELECT
    -- the keys as trained_tokens types them
    covered.* EXCLUDE (student_lp, teacher_lp, opd_reverse_kl),
    student_lp::DOUBLE AS train_log_prob,  -- nats
    teacher_lp::DOUBLE AS teacher_log_prob,  -- nats
    opd_reverse_kl::DOUBLE AS opd_reverse_kl,  -- nats
    (student_lp - teacher_lp)::DOUBLE AS lp_diff,  -- nats
    ABS(student_lp - teacher_lp)::DOUBLE AS abs_lp_diff,  -- nats
    EXP(student_lp - teacher_lp)::DOUBLE AS ratio,  -- student / teacher probability
    k3_term(student_lp - teacher_lp)::DOUBLE AS k3  -- nats
FROM covered
