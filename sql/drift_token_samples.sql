-- Each covered finite token's drift values with the columns of its sample that the drift_by_*
-- views group by: the one join of drift_tokens with samples.
-- Grain: one row per row of drift_tokens (run, rollout_id, batch_position, position).
-- Inputs: drift_tokens, samples; macro with_sample_properties (sql/macros), which joins the
--         two.
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
    run::VARCHAR AS run,
    rollout_id::BIGINT AS rollout_id,
    batch_position::INTEGER AS batch_position,
    lp_diff::DOUBLE AS lp_diff,
    abs_lp_diff::DOUBLE AS abs_lp_diff,
    k3::DOUBLE AS k3,
    response_length::INTEGER AS response_length,
    dumped_rank::BIGINT AS dumped_rank,
    staleness::BIGINT AS staleness,
    mixed_version::BOOLEAN AS mixed_version
FROM with_sample_properties(drift_tokens)
