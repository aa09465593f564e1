-- Drift by token id: which vocabulary entries carry the mismatch (the top offenders).
-- Grain: one row per (run, rollout_id, token_id) with at least one covered finite token.
-- Token texts come from the run's `vocab` table (NULL when the dump saved no tokenizer/).
-- Inputs: drift_token_id_parts (the per-step rollup: one row per token id with its partial
--         sums and rank; `samples` adds up drift_tokens.first_occurrence), vocab; macros
--         drift_means, drift_statistics (sql/macros).
-- Columns:
--   run               VARCHAR  run name
--   rollout_id        BIGINT   training step
--   token_id          BIGINT   token id
--   token_text        VARCHAR  the token decoded alone (NULL without a tokenizer)
--   tokens            BIGINT   covered finite occurrences of the token in the step
--   samples           BIGINT   samples containing it
--   mean_lp_diff      DOUBLE   mean delta (nats)
--   mean_abs_lp_diff  DOUBLE   mean |delta| (nats)
--   max_abs_lp_diff   DOUBLE   max |delta| (nats)
--   k3_kl             DOUBLE   mean of r - 1 - delta (nats)
--   k3_share          DOUBLE   the token's sum of k3 / the step's sum of k3 (fraction)
--   k3_rank           BIGINT   1 = the token with the largest k3_share in the step (ties by id)
--   mult_prob_error   DOUBLE   mean exp(|delta|) (ratio)
CREATE OR REPLACE VIEW drift_by_token AS
WITH keyed AS (
    SELECT
        run,
        rollout_id,
        '' AS share_scope,
        token_id,
        k3_rank,
        * EXCLUDE (run, rollout_id, token_id, k3_rank)
    FROM drift_token_id_parts
),
grouped AS MATERIALIZED (
    SELECT * FROM drift_means(keyed)
)
SELECT
    r.run::VARCHAR AS run,
    r.rollout_id::BIGINT AS rollout_id,
    r.token_id::BIGINT AS token_id,
    v.token_text::VARCHAR AS token_text,
    r.tokens::BIGINT AS tokens,
    r.samples::BIGINT AS samples,
    r.mean_lp_diff::DOUBLE AS mean_lp_diff,
    r.mean_abs_lp_diff::DOUBLE AS mean_abs_lp_diff,
    r.max_abs_lp_diff::DOUBLE AS max_abs_lp_diff,
    r.k3_kl::DOUBLE AS k3_kl,
    r.k3_share::DOUBLE AS k3_share,
    r.k3_rank::BIGINT AS k3_rank,
    r.mult_prob_error::DOUBLE AS mult_prob_error
FROM drift_statistics(grouped) AS r
LEFT JOIN vocab AS v ON v.run = r.run AND v.token_id = r.token_id
ORDER BY r.run, r.rollout_id, r.k3_rank
