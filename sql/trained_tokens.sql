-- The training tokens under the loss, keyed and typed once for the two token-level drift
-- views: drift_tokens (trainer against rollout engine) and drift_teacher_tokens (trainer
-- against teacher) each keep the rows their own log-probs make comparable.
-- Grain: one row per training token with loss_mask > 0 (run, rollout_id, batch_position,
--        position); eval rows are not here.
-- Inputs: tokens.
-- Columns:
--   run               VARCHAR  run name
--   rollout_id        BIGINT   training step
--   batch_position    INTEGER  sample's position in the rollout dump
--   sample_index      BIGINT   Sample.index
--   position          INTEGER  0-based response position
--   token_id          BIGINT   token id
--   turn_index        INTEGER  0-based loss-covered run of the response, as in `tokens`
--   loss_mask         TINYINT  as in `tokens` (> 0 here)
--   first_occurrence  BOOLEAN  as in `tokens`
--   token_version     VARCHAR  as in `tokens`
--   token_staleness   BIGINT   as in `tokens`
--   support_size      INTEGER  as in `tokens`
--   train_log_prob    FLOAT    trainer (student) log-prob (nats), as in `tokens`
--   rollout_log_prob  FLOAT    engine log-prob (nats), as in `tokens`
--   teacher_log_prob  FLOAT    teacher log-prob (nats), as in `tokens`
--   lp_diff           FLOAT    train - rollout (nats), as in `tokens`
--   entropy           FLOAT    actor entropy (nats), as in `tokens`
--   opd_reverse_kl    FLOAT    the writer's reverse-KL estimate, as in `tokens`
CREATE OR REPLACE VIEW trained_tokens AS
SELECT
    run::VARCHAR AS run,
    rollout_id::BIGINT AS rollout_id,
    batch_position::INTEGER AS batch_position,
    sample_index::BIGINT AS sample_index,
    position::INTEGER AS position,
    token_id::BIGINT AS token_id,
    turn_index::INTEGER AS turn_index,
    loss_mask::TINYINT AS loss_mask,
    first_occurrence::BOOLEAN AS first_occurrence,
    token_version::VARCHAR AS token_version,
    token_staleness::BIGINT AS token_staleness,
    support_size::INTEGER AS support_size,
    train_log_prob::FLOAT AS train_log_prob,
    rollout_log_prob::FLOAT AS rollout_log_prob,
    teacher_log_prob::FLOAT AS teacher_log_prob,
    lp_diff::FLOAT AS lp_diff,
    entropy::FLOAT AS entropy,
    opd_reverse_kl::FLOAT AS opd_reverse_kl
FROM tokens
WHERE NOT evaluation
    AND loss_mask > 0
