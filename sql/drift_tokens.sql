-- The token population every drift statistic is computed over, with per-token derived values.
-- Grain: one row per loss-covered, finite token of a training step
--        (run, rollout_id, batch_position, position).
-- Covered: evaluation = false, loss_mask > 0 and lp_diff not null (so both log-probs exist).
-- Finite: lp_diff, train_log_prob and rollout_log_prob all finite. Covered tokens with a NaN or
-- infinite value are left out of every drift statistic; drift_steps counts them
-- (`nonfinite_tokens`) and the audit `nonfinite_log_probs` lists them.
-- Inputs: trained_tokens (the training tokens under the loss); macros drift_covered,
--         drift_finite, k3_term (sql/macros).
-- Columns:
--   run               VARCHAR  run name
--   rollout_id        BIGINT   training step
--   batch_position    INTEGER  sample's position in the rollout dump
--   sample_index      BIGINT   Sample.index
--   position          INTEGER  0-based response position
--   token_id          BIGINT   token id
--   turn_index        INTEGER  0-based loss-covered run of the response, as in `tokens`
--   first_occurrence  BOOLEAN  the sample's first row here with this token_id, as in `tokens`
--   token_version     VARCHAR  weight version that generated the token, as in `tokens`
--   token_staleness   BIGINT   rollout_id - token_version (steps), as in `tokens`
--   support_size      INTEGER  ids the sampler kept here, as in `tokens` (null: unbounded)
--   train_log_prob    DOUBLE   trainer log-prob (nats)
--   rollout_log_prob  DOUBLE   engine log-prob (nats)
--   entropy           DOUBLE   actor entropy at the position (nats), null if not dumped
--   lp_diff           DOUBLE   delta = train - rollout (nats)
--   abs_lp_diff       DOUBLE   |delta| (nats)
--   ratio             DOUBLE   r = exp(delta)
--   k3                DOUBLE   r - 1 - delta (nats)
--   train_prob        DOUBLE   exp(train_log_prob)
--   rollout_prob      DOUBLE   exp(rollout_log_prob)
--   abs_prob_diff     DOUBLE   |train_prob - rollout_prob|
CREATE OR REPLACE VIEW drift_tokens AS
WITH covered AS (
    SELECT
        run,
        rollout_id,
        batch_position,
        sample_index,
        position,
        token_id,
        turn_index,
        first_occurrence,
        token_version,
        token_staleness,
        support_size,
        train_log_prob::DOUBLE AS train_lp,
        rollout_log_prob::DOUBLE AS rollout_lp,
        entropy::DOUBLE AS entropy,
        lp_diff::DOUBLE AS delta
    FROM trained_tokens
    WHERE drift_covered(loss_mask, lp_diff)
        AND drift_finite(lp_diff, train_log_prob, rollout_log_prob)
)
SELECT
    -- the keys as trained_tokens types them
    covered.* EXCLUDE (train_lp, rollout_lp, entropy, delta),
    train_lp::DOUBLE AS train_log_prob,
    rollout_lp::DOUBLE AS rollout_log_prob,
    entropy::DOUBLE AS entropy,
    delta::DOUBLE AS lp_diff,
    ABS(delta)::DOUBLE AS abs_lp_diff,
    EXP(delta)::DOUBLE AS ratio,
    k3_term(delta)::DOUBLE AS k3,
    EXP(train_lp)::DOUBLE AS train_prob,
    EXP(rollout_lp)::DOUBLE AS rollout_prob,
    ABS(EXP(train_lp) - EXP(rollout_lp))::DOUBLE AS abs_prob_diff
FROM covered
