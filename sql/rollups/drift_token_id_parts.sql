-- Drift per token id of a step: the rollup behind drift_by_token, which ranks its rows and adds
-- the token texts. Written for each step at commit (docs/rollups.md).
-- Grain: one row per (run, rollout_id, token_id) with at least one covered finite token.
-- Inputs: drift_tokens; macros drift_terms, drift_totals (sql/macros).
-- Settings: none.
-- `samples` adds up drift_tokens.first_occurrence (one true row per sample and token id, set
-- at extraction): a distinct count over ~30 k ids a step cost twice the time.
-- Columns:
--   run               VARCHAR  run name
--   rollout_id        BIGINT   training step
--   token_id          BIGINT   token id
--   tokens            BIGINT   covered finite occurrences of the token in the step
--   samples           BIGINT   samples containing it
--   mean_lp_diff      DOUBLE   mean delta (nats)
--   mean_abs_lp_diff  DOUBLE   mean |delta| (nats)
--   max_abs_lp_diff   DOUBLE   max |delta| (nats)
--   k3_kl             DOUBLE   mean of r - 1 - delta (nats)
--   k3_sum            DOUBLE   sum of r - 1 - delta (nats)
--   k3_share          DOUBLE   k3_sum / the step's k3 sum (fraction; null when that sum is 0)
--   k3_rank           BIGINT   1 = the step's largest k3_sum (ties by token_id)
--   mult_prob_error   DOUBLE   mean exp(|delta|) (ratio)
CREATE OR REPLACE VIEW drift_token_id_parts AS
WITH keyed AS (
    SELECT
        run,
        rollout_id,
        token_id,
        first_occurrence::INTEGER AS samples,
        lp_diff,
        abs_lp_diff,
        k3
    FROM drift_tokens
),
terms AS (
    SELECT * FROM drift_terms(keyed)
),
totals AS (
    SELECT '' AS share_scope, * FROM drift_totals(terms)
)
SELECT
    run::VARCHAR AS run,
    rollout_id::BIGINT AS rollout_id,
    token_id::BIGINT AS token_id,
    tokens::BIGINT AS tokens,
    samples::BIGINT AS samples,
    mean_lp_diff::DOUBLE AS mean_lp_diff,
    mean_abs_lp_diff::DOUBLE AS mean_abs_lp_diff,
    max_abs_lp_diff::DOUBLE AS max_abs_lp_diff,
    k3_kl::DOUBLE AS k3_kl,
    k3_sum::DOUBLE AS k3_sum,
    -- Both within the step: computed once at commit, not at every query.
    step_share(k3_sum, run, rollout_id, share_scope)::DOUBLE AS k3_share,
    ROW_NUMBER() OVER (PARTITION BY run, rollout_id ORDER BY k3_sum DESC, token_id)::BIGINT
        AS k3_rank,
    mult_prob_error::DOUBLE AS mult_prob_error
FROM totals
