-- Each covered finite token's drift values with the columns of its sample that the drift_by_*
-- views group by: the one join of drift_tokens with samples.
-- Grain: one row per row of drift_tokens (run, rollout_id, batch_position, position).
-- Inputs: drift_tokens, samples.
-- A token whose sample has no row in `samples` keeps its row, with null sample columns.
-- Columns:
--   run              VARCHAR  run name
--   rollout_id       BIGINT   training step
--   batch_position   INTEGER  sample's position in the rollout dump
--   lp_diff          DOUBLE   delta = train - rollout log-prob (nats)
--   abs_lp_diff      DOUBLE   |delta| (nats)
--   k3               DOUBLE   r - 1 - delta (nats)
--   response_length  INTEGER  samples.response_length (tokens)
--   dumped_rank      BIGINT   samples.dumped_rank: lowest global rank whose train file holds
--                             the sample (one per DP shard)
--   staleness        BIGINT   samples.staleness = rollout_id - weight_version_min (steps)
--   mixed_version    BOOLEAN  samples.mixed_version: the engine changed weights mid-sample
CREATE OR REPLACE VIEW drift_token_samples AS
SELECT
    t.run::VARCHAR AS run,
    t.rollout_id::BIGINT AS rollout_id,
    t.batch_position::INTEGER AS batch_position,
    t.lp_diff::DOUBLE AS lp_diff,
    t.abs_lp_diff::DOUBLE AS abs_lp_diff,
    t.k3::DOUBLE AS k3,
    s.response_length::INTEGER AS response_length,
    s.dumped_rank::BIGINT AS dumped_rank,
    s.staleness::BIGINT AS staleness,
    s.mixed_version::BOOLEAN AS mixed_version
FROM drift_tokens AS t
LEFT JOIN samples AS s
    ON s.run = t.run
    AND s.rollout_id = t.rollout_id
    AND NOT s.evaluation
    AND s.batch_position = t.batch_position
