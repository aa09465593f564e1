-- Drift per token id of a step, as partial sums: the rollup behind drift_by_token, which
-- divides them into means and shares (macros drift_totals, drift_statistics) and adds the
-- token texts. Written for each step at commit (docs/rollups.md).
-- Grain: one row per (run, rollout_id, token_id) with at least one covered finite token.
-- Inputs: drift_tokens; macros drift_terms, drift_sums (sql/macros).
-- Settings: none.
-- `samples` adds up drift_tokens.first_occurrence (one true row per sample and token id, set
-- at extraction): a distinct count over ~30 k ids a step cost twice the time.
-- Columns:
--   run                  VARCHAR  run name
--   rollout_id           BIGINT   training step
--   token_id             BIGINT   token id
--   k3_rank              BIGINT   1 = the step's largest k3_sum (ties by token_id)
--   tokens               BIGINT   covered finite occurrences of the token in the step
--   samples              BIGINT   samples containing it
--   lp_diff_sum          DOUBLE   sum of delta (nats)
--   abs_lp_diff_sum      DOUBLE   sum of |delta| (nats)
--   max_abs_lp_diff      DOUBLE   max |delta| (nats)
--   k3_sum               DOUBLE   sum of r - 1 - delta (nats)
--   exp_abs_lp_diff_sum  DOUBLE   sum of exp(|delta|)
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
sums AS (
    SELECT * FROM drift_sums(terms)
)
SELECT
    run::VARCHAR AS run,
    rollout_id::BIGINT AS rollout_id,
    token_id::BIGINT AS token_id,
    -- Within the step: ranked once at commit, not at every query.
    ROW_NUMBER() OVER (PARTITION BY run, rollout_id ORDER BY k3_sum DESC, token_id)::BIGINT
        AS k3_rank,
    tokens::BIGINT AS tokens,
    samples::BIGINT AS samples,
    lp_diff_sum::DOUBLE AS lp_diff_sum,
    abs_lp_diff_sum::DOUBLE AS abs_lp_diff_sum,
    max_abs_lp_diff::DOUBLE AS max_abs_lp_diff,
    k3_sum::DOUBLE AS k3_sum,
    exp_abs_lp_diff_sum::DOUBLE AS exp_abs_lp_diff_sum
FROM sums
