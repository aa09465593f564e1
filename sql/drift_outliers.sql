-- The worst tokens of each training step by |delta|, with where they sit and both log-probs.
-- Grain: one row per (run, rollout_id, outlier_rank), outlier_rank 1..outliers_per_step
--        (fewer when the step has fewer covered finite tokens). Non-finite tokens are not here;
--        the audit `nonfinite_log_probs` lists them.
-- Inputs: drift_tokens, drift_settings (outliers_per_step).
-- Columns:
--   run, rollout_id            keys
--   outlier_rank      BIGINT   1 = largest |delta| in the step (ties: batch_position, position)
--   batch_position    INTEGER  sample's position in the rollout dump
--   sample_index      BIGINT   Sample.index
--   position          INTEGER  0-based response position
--   token_id          BIGINT   token id
--   train_log_prob    DOUBLE   trainer log-prob (nats)
--   rollout_log_prob  DOUBLE   engine log-prob (nats)
--   lp_diff           DOUBLE   delta (nats)
--   abs_lp_diff       DOUBLE   |delta| (nats)
--   ratio             DOUBLE   r = exp(delta)
--   entropy           DOUBLE   actor entropy (nats), null if not dumped
CREATE OR REPLACE VIEW drift_outliers AS
WITH ranked AS (
    SELECT
        t.*,
        row_number() OVER (
            PARTITION BY t.run, t.rollout_id
            ORDER BY t.abs_lp_diff DESC, t.batch_position, t.position
        ) AS outlier_rank,
        s.outliers_per_step
    FROM drift_tokens AS t
    CROSS JOIN drift_settings AS s
)
SELECT
    run::VARCHAR AS run,  -- run name
    rollout_id::BIGINT AS rollout_id,  -- training step
    outlier_rank::BIGINT AS outlier_rank,  -- 1 = worst
    batch_position::INTEGER AS batch_position,  -- sample's position in the rollout dump
    sample_index::BIGINT AS sample_index,  -- Sample.index
    position::INTEGER AS position,  -- response position
    token_id::BIGINT AS token_id,  -- token id
    train_log_prob::DOUBLE AS train_log_prob,  -- nats
    rollout_log_prob::DOUBLE AS rollout_log_prob,  -- nats
    lp_diff::DOUBLE AS lp_diff,  -- nats
    abs_lp_diff::DOUBLE AS abs_lp_diff,  -- nats
    ratio::DOUBLE AS ratio,  -- exp(delta)
    entropy::DOUBLE AS entropy  -- nats
FROM ranked
WHERE outlier_rank <= outliers_per_step
ORDER BY run, rollout_id, outlier_rank
