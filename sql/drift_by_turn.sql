-- Drift by turn (segment) of a multi-turn response: is a later turn, scored after tool output,
-- worse than the first?
-- Grain: one row per (run, rollout_id, turn_index) with at least one covered finite token.
-- Segments: within one sample's response (all its tokens, masked ones included, by position),
-- a segment is a maximal run of tokens with loss_mask > 0; turn_index numbers them from 0. A new
-- segment therefore starts after each run of masked tokens (tool/observation output); masked
-- tokens before the first trained token do not open a segment of their own.
-- Computed without a window over all tokens: for a trained token at p, turn_index = (1 if
-- position 0 is trained else 0) + (masked runs that end before p) - 1, where a masked run ends
-- at q when q + 1 is not masked. Only the masked tokens are scanned for that, and each sample's
-- run ends become one short list that the trained tokens are joined to.
-- Inputs: tokens (for the masks), drift_tokens; macro drift_breakdown (sql/macros).
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
WITH masked AS (
    SELECT run, rollout_id, batch_position, position
    FROM tokens
    WHERE NOT evaluation
        AND NOT COALESCE(loss_mask > 0, FALSE)
),
run_ends AS (
    -- Per sample: where each masked run ends, and whether the response starts trained.
    SELECT
        m.run,
        m.rollout_id,
        m.batch_position,
        LIST(m.position ORDER BY m.position) FILTER (WHERE n.position IS NULL) AS ends,
        NOT BOOL_OR(m.position = 0) AS starts_trained
    FROM masked AS m
    LEFT JOIN masked AS n
        ON n.run = m.run
        AND n.rollout_id = m.rollout_id
        AND n.batch_position = m.batch_position
        AND n.position = m.position + 1
    GROUP BY m.run, m.rollout_id, m.batch_position
),
keyed AS (
    SELECT
        t.run,
        t.rollout_id,
        t.batch_position,
        '' AS share_scope,
        COALESCE(e.starts_trained, TRUE)::INTEGER
            + LEN([q FOR q IN COALESCE(e.ends, []) IF q < t.position]) - 1 AS turn_index,
        t.lp_diff,
        t.abs_lp_diff,
        t.k3
    FROM drift_tokens AS t
    LEFT JOIN run_ends AS e
        ON e.run = t.run
        AND e.rollout_id = t.rollout_id
        AND e.batch_position = t.batch_position
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
    k3_share::DOUBLE AS k3_share,  -- fraction of the step's k3 sum
    mult_prob_error::DOUBLE AS mult_prob_error  -- ratio
FROM drift_breakdown(keyed)
ORDER BY run, rollout_id, turn_index
