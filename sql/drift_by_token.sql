-- Drift by token id: which vocabulary entries carry the mismatch (the top offenders).
-- Grain: one row per (run, rollout_id, token_id) with at least one covered finite token.
-- Token texts come from the run's `vocab` table (NULL when the dump saved no tokenizer/).
-- Inputs: drift_tokens, vocab.
-- Columns:
--   run, rollout_id          keys
--   token_id        BIGINT   token id
--   token_text      VARCHAR  the token decoded alone (NULL without a tokenizer)
--   tokens          BIGINT   covered finite occurrences of the token in the step
--   samples         BIGINT   samples containing it
--   mean_lp_diff    DOUBLE   mean delta (nats)
--   mean_abs_lp_diff DOUBLE  mean |delta| (nats)
--   max_abs_lp_diff DOUBLE   max |delta| (nats)
--   k3_kl           DOUBLE   mean of r - 1 - delta (nats)
--   k3_share        DOUBLE   the token's sum of k3 / the step's sum of k3 (fraction)
--   k3_rank         BIGINT   1 = the token with the largest k3_share in the step (ties by id)
--   mult_prob_error DOUBLE   mean exp(|delta|) (ratio)
CREATE OR REPLACE VIEW drift_by_token AS
WITH grouped AS (
    SELECT
        run,
        rollout_id,
        token_id,
        count(*) AS tokens,
        count(DISTINCT batch_position) AS samples,
        avg(lp_diff) AS mean_lp_diff,
        avg(abs_lp_diff) AS mean_abs_lp_diff,
        max(abs_lp_diff) AS max_abs_lp_diff,
        avg(k3) AS k3_kl,
        sum(k3) / nullif(sum(sum(k3)) OVER (PARTITION BY run, rollout_id), 0) AS k3_share,
        row_number() OVER (PARTITION BY run, rollout_id ORDER BY sum(k3) DESC, token_id) AS k3_rank,
        avg(exp(abs_lp_diff)) AS mult_prob_error
    FROM drift_tokens
    GROUP BY run, rollout_id, token_id
)
SELECT
    run::VARCHAR AS run,  -- run name
    rollout_id::BIGINT AS rollout_id,  -- training step
    token_id::BIGINT AS token_id,  -- token id
    v.token_text::VARCHAR AS token_text,  -- decoded token, NULL without a tokenizer
    tokens::BIGINT AS tokens,  -- covered finite occurrences
    samples::BIGINT AS samples,  -- samples containing the token
    mean_lp_diff::DOUBLE AS mean_lp_diff,  -- nats
    mean_abs_lp_diff::DOUBLE AS mean_abs_lp_diff,  -- nats
    max_abs_lp_diff::DOUBLE AS max_abs_lp_diff,  -- nats
    k3_kl::DOUBLE AS k3_kl,  -- nats
    k3_share::DOUBLE AS k3_share,  -- fraction of the step's k3 sum
    k3_rank::BIGINT AS k3_rank,  -- 1 = worst
    mult_prob_error::DOUBLE AS mult_prob_error  -- ratio
FROM grouped
LEFT JOIN vocab AS v USING (run, token_id)
ORDER BY run, rollout_id, k3_rank
