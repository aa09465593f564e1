-- The candidate token rows of the token-listing audits (nonfinite_log_probs,
-- placeholder_rollout_log_prob, large_lp_diff) in the tokens' own types: the rollup
-- audit_token_rows widened them to the types a rollup stores, and these casts back are exact.
-- Grain: one row per candidate token row (run, rollout_id, evaluation, batch_position,
--        position), as audit_token_rows (normally none).
-- Inputs: audit_token_rows.
-- Columns:
--   run               VARCHAR  run name
--   rollout_id        BIGINT   training step
--   evaluation        BOOLEAN  true for rows from rollout_data/eval_{rid}.pt
--   batch_position    INTEGER  sample's position in the rollout dump
--   sample_index      BIGINT   Sample.index
--   position          INTEGER  0-based response position
--   token_id          BIGINT   token id
--   loss_mask         TINYINT  as tokens.loss_mask
--   train_log_prob    FLOAT    trainer log-prob (nats), as in tokens
--   rollout_log_prob  FLOAT    engine log-prob (nats), as in tokens
--   lp_diff           FLOAT    train - rollout (nats), as in tokens
CREATE OR REPLACE VIEW audit_tokens AS
SELECT
    -- typed by audit_token_rows
    run,
    rollout_id,
    evaluation,
    batch_position,
    sample_index,
    position,
    token_id,
    loss_mask::TINYINT AS loss_mask,
    train_log_prob::FLOAT AS train_log_prob,
    rollout_log_prob::FLOAT AS rollout_log_prob,
    lp_diff::FLOAT AS lp_diff
FROM audit_token_rows
