-- Drift by turn (segment) of a multi-turn response: is a later turn, scored after tool output,
-- worse than the first?
-- Grain: one row per (run, rollout_id, turn_index) with at least one covered finite token.
-- Segments: within one sample's response (all its tokens, masked ones included, by position),
-- a segment is a maximal run of tokens with loss_mask > 0; turn_index numbers them from 0. A new
-- segment therefore starts after each run of masked tokens (tool/observation output); masked
-- tokens before the first trained token do not open a segment of their own. The number is
-- stored per token at extraction (`tokens.turn_index`), so the rollup groups by it.
-- Inputs: drift_breakdown_parts (the per-step rollup, dimension 'turn'); macro
--         drift_statistics (sql/macros).
-- Columns:
--   run              VARCHAR  run name
--   rollout_id       BIGINT   training step
--   turn_index       INTEGER  0-based segment index within the response
--   + the columns of macro drift_statistics (sql/macros/drift_breakdown.sql): tokens,
--     samples, mean_lp_diff, mean_abs_lp_diff, max_abs_lp_diff, k3_kl, k3_share (within the
--     step), mult_prob_error
CREATE OR REPLACE VIEW drift_by_turn AS
WITH grouped AS MATERIALIZED (
    SELECT
        run,
        rollout_id,
        '' AS share_scope,
        bucket AS turn_index,
        * EXCLUDE (run, rollout_id, dimension, bucket, token_version, token_staleness)
    FROM drift_breakdown_parts
    WHERE dimension = 'turn'
)
SELECT * REPLACE (turn_index::INTEGER AS turn_index)
FROM drift_statistics(grouped)
ORDER BY run, rollout_id, turn_index
