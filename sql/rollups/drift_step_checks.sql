-- Per-step token counts and correlations behind the step audits mixed_sampling_support,
-- shifted_log_probs and tokens_beyond_ln2 (which apply their thresholds to these rows).
-- Grain: one row per training step (run, rollout_id) with at least one row in drift_tokens.
-- Neighbours: the next / previous drift token of the same sample by position, as LEAD / LAG
--   over the sample would give: each sample's (train, rollout) log-prob pairs are listed in
--   position order once, in one list (one ordered aggregate, not one a log-prob: 1.2 % fewer
--   instructions for a bench step's rollups), and unnested beside the same list shifted by one
--   (cheaper than a window over the step).
-- Inputs: drift_tokens.
-- Settings: none.
-- Columns:
--   run               VARCHAR  run name
--   rollout_id        BIGINT   training step
--   tokens            BIGINT   drift tokens with a finite lp_diff
--   beyond_ln2        BIGINT   of those, tokens with |lp_diff| > ln 2
--   bounded_tokens    BIGINT   drift tokens with support_size not null
--   unbounded_tokens  BIGINT   drift tokens with support_size null
--   pairs             BIGINT   drift tokens with a next neighbour
--   corr_same         DOUBLE   correlation of train_log_prob with rollout_log_prob
--   corr_next         DOUBLE   correlation of train_log_prob with the next one's
--                              rollout_log_prob
--   corr_previous     DOUBLE   correlation of train_log_prob with the previous one's
--                              rollout_log_prob
CREATE OR REPLACE VIEW drift_step_checks AS
WITH per_sample AS (
    SELECT
        run,
        rollout_id,
        COUNT(*) FILTER (WHERE ISFINITE(lp_diff)) AS tokens,
        COUNT(*) FILTER (WHERE ISFINITE(lp_diff) AND ABS(lp_diff) > LN(2)) AS beyond_ln2,
        COUNT(*) FILTER (WHERE support_size IS NOT NULL) AS bounded_tokens,
        COUNT(*) FILTER (WHERE support_size IS NULL) AS unbounded_tokens,
        LIST({'train': train_log_prob, 'rollout': rollout_log_prob} ORDER BY position) AS log_probs
    FROM drift_tokens
    GROUP BY run, rollout_id, batch_position
),
neighbours AS (
    -- UNNEST zips the lists, padding the shorter ones with NULL (a NULL pair, whose fields
    -- CORR and COUNT skip): log_probs[2:] puts the next token's pair beside each token, the
    -- list with a NULL prepended the previous one's.
    SELECT
        run,
        rollout_id,
        UNNEST(log_probs) AS this_token,
        UNNEST(log_probs[2:]) AS next_token,
        UNNEST(list_prepend(NULL, log_probs)) AS previous_token
    FROM per_sample
),
correlations AS (
    SELECT
        run,
        rollout_id,
        COUNT(next_token.rollout) AS pairs,
        CORR(this_token.train, this_token.rollout) AS corr_same,
        CORR(this_token.train, next_token.rollout) AS corr_next,
        CORR(this_token.train, previous_token.rollout) AS corr_previous
    FROM neighbours
    GROUP BY run, rollout_id
),
counts AS (
    SELECT
        run,
        rollout_id,
        SUM(tokens) AS tokens,
        SUM(beyond_ln2) AS beyond_ln2,
        SUM(bounded_tokens) AS bounded_tokens,
        SUM(unbounded_tokens) AS unbounded_tokens
    FROM per_sample
    GROUP BY run, rollout_id
)
SELECT
    run::VARCHAR AS run,
    rollout_id::BIGINT AS rollout_id,
    c.tokens::BIGINT AS tokens,
    c.beyond_ln2::BIGINT AS beyond_ln2,
    c.bounded_tokens::BIGINT AS bounded_tokens,
    c.unbounded_tokens::BIGINT AS unbounded_tokens,
    r.pairs::BIGINT AS pairs,
    r.corr_same::DOUBLE AS corr_same,
    r.corr_next::DOUBLE AS corr_next,
    r.corr_previous::DOUBLE AS corr_previous
FROM counts AS c
JOIN correlations AS r USING (run, rollout_id)
