-- Each training sample's drift sums beside the sample properties the per-sample breakdowns
-- group on (drift_by_length, drift_by_rank, drift_by_staleness): the per-sample rollup joined
-- with `samples`, so those views need no pass over the tokens.
-- Grain: one row per training-step sample with at least one covered finite token
--        (run, rollout_id, batch_position). A sample without a row in `samples` keeps its
--        sums, with null properties.
-- Inputs: drift_sample_parts, samples; macro with_sample_properties (sql/macros), which joins
--         the two.
-- Columns:
--   run                  VARCHAR  run name
--   rollout_id           BIGINT   training step
--   batch_position       INTEGER  sample's position in the rollout dump
--   response_length      INTEGER  as samples.response_length (tokens)
--   dumped_rank          BIGINT   as samples.dumped_rank
--   staleness            BIGINT   as samples.staleness (steps)
--   mixed_version        BOOLEAN  as samples.mixed_version
--   samples              INTEGER  1: the row counts its sample once
--   tokens               BIGINT   covered finite tokens of the sample
--   lp_diff_sum          DOUBLE   sum of delta (nats)
--   abs_lp_diff_sum      DOUBLE   sum of |delta| (nats)
--   max_abs_lp_diff      DOUBLE   max |delta| (nats)
--   k3_sum               DOUBLE   sum of r - 1 - delta (nats)
--   exp_abs_lp_diff_sum  DOUBLE   sum of exp(|delta|)
CREATE OR REPLACE VIEW drift_sample_terms AS
SELECT
    run::VARCHAR AS run,
    rollout_id::BIGINT AS rollout_id,
    batch_position::INTEGER AS batch_position,
    response_length::INTEGER AS response_length,
    dumped_rank::BIGINT AS dumped_rank,
    staleness::BIGINT AS staleness,
    mixed_version::BOOLEAN AS mixed_version,
    1::INTEGER AS samples,
    tokens::BIGINT AS tokens,
    sum_lp_diff::DOUBLE AS lp_diff_sum,
    abs_lp_diff_sum::DOUBLE AS abs_lp_diff_sum,
    max_abs_lp_diff::DOUBLE AS max_abs_lp_diff,
    k3_sum::DOUBLE AS k3_sum,
    exp_abs_lp_diff_sum::DOUBLE AS exp_abs_lp_diff_sum
FROM with_sample_properties(drift_sample_parts)
