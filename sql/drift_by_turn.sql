-- Drift by turn (segment) of a multi-turn response: is a later turn, scored after tool output,
-- worse than the first?
-- Grain: one row per (run, rollout_id, turn_index) with at least one covered finite token.
-- Segments: within one sample's response (all its tokens, masked ones included, by position),
-- a segment is a maximal run of tokens with loss_mask > 0; turn_index numbers them from 0. A new
-- segment therefore starts after each run of masked tokens (tool/observation output); masked
-- tokens before the first trained token do not open a segment of their own. The number is
-- stored per token at extraction (`tokens.turn_index`), so this is one GROUP BY.
-- Inputs: drift_tokens; macro drift_breakdown (sql/macros).
-- Columns:
--   run, rollout_id          keys
--   turn_index      INTEGER  0-based segment index within the response
--   tokens          BIGINT   covered finite tokens in that segment across the step
--   samples         BIGINT   samples that have this segment
--   mean_lp_diff    DOUBLE   mean delta (nats)
--   mean_abs_lp_diff DOUBLE  mean |delta| (nats)
--   max_abs_lp_diff DOUBLE   max |delta| (nats)
--   k3_kl           DOUBLE   mean of r - 1 - delta (nats)
--   k3_share        DOUBLE   the segment's k3 sum / the step's k3 sum (fraction)
--   mult_prob_error DOUBLE   mean exp(|delta|) (ratio)
CREATE OR REPLACE VIEW drift_by_turn AS
WITH keyed AS (
    SELECT
        run,
        rollout_id,
        batch_position,
        '' AS share_scope,
        turn_index,
        lp_diff,
        abs_lp_diff,
        k3
    FROM drift_tokens
),
grouped AS MATERIALIZED (
    SELECT * FROM drift_breakdown(keyed)
)
SELECT
    run::VARCHAR AS run,  -- run name
    rollout_id::BIGINT AS rollout_id,  -- training step
    turn_index::INTEGER AS turn_index,  -- 0 = first trained segment
    tokens::BIGINT AS tokens,  -- covered finite tokens
    samples::BIGINT AS samples,  -- samples
    mean_lp_diff::DOUBLE AS mean_lp_diff,  -- nats
    mean_abs_lp_diff::DOUBLE AS mean_abs_lp_diff,  -- nats
    max_abs_lp_diff::DOUBLE AS max_abs_lp_diff,  -- nats
    k3_kl::DOUBLE AS k3_kl,  -- nats
    step_share(k3_sum, run, rollout_id, share_scope)::DOUBLE AS k3_share,  -- fraction of the step's k3 sum
    mult_prob_error::DOUBLE AS mult_prob_error  -- ratio
FROM grouped
ORDER BY run, rollout_id, turn_index
