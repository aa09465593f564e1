-- The token rows the token-listing audits can name, per step (normally none): each audit
-- (nonfinite_log_probs, placeholder_rollout_log_prob, large_lp_diff) applies its own rule to
-- these rows instead of scanning the tokens.
-- Grain: one row per token row (run, rollout_id, evaluation, batch_position, position) that
--        has a non-finite log-prob or lp_diff (any mask, train and eval), or is loss-covered
--        with rollout_log_prob = 0.0 (train and eval), or is a loss-covered training token
--        with a finite |lp_diff| of at least large_lp_diff_floor() (5 nats).
-- Inputs: tokens; macro large_lp_diff_floor (sql/macros).
-- Settings: none.
-- Columns (the tokens columns, widened to the rollup types; the view audit_tokens casts back):
--   run               VARCHAR  run name
--   rollout_id        BIGINT   training step
--   evaluation        BOOLEAN  true for rows from rollout_data/eval_{rid}.pt
--   batch_position    INTEGER  sample's position in the rollout dump
--   sample_index      BIGINT   Sample.index
--   position          INTEGER  0-based response position
--   token_id          BIGINT   token id
--   loss_mask         INTEGER  tokens.loss_mask (TINYINT there)
--   train_log_prob    DOUBLE   trainer log-prob (nats; FLOAT in tokens)
--   rollout_log_prob  DOUBLE   engine log-prob (nats; FLOAT in tokens)
--   lp_diff           DOUBLE   train - rollout (nats; FLOAT in tokens)
CREATE OR REPLACE VIEW audit_token_rows AS
SELECT
    run::VARCHAR AS run,
    rollout_id::BIGINT AS rollout_id,
    evaluation::BOOLEAN AS evaluation,
    batch_position::INTEGER AS batch_position,
    sample_index::BIGINT AS sample_index,
    position::INTEGER AS position,
    token_id::BIGINT AS token_id,
    loss_mask::INTEGER AS loss_mask,
    train_log_prob::DOUBLE AS train_log_prob,
    rollout_log_prob::DOUBLE AS rollout_log_prob,
    lp_diff::DOUBLE AS lp_diff
FROM tokens
WHERE NOT ISFINITE(train_log_prob)
    OR NOT ISFINITE(rollout_log_prob)
    OR NOT ISFINITE(lp_diff)
    OR (loss_mask > 0 AND rollout_log_prob = 0.0)
    OR (
        NOT evaluation
        AND loss_mask > 0
        AND ISFINITE(lp_diff)
        AND ABS(lp_diff) >= large_lp_diff_floor()
    )
