-- sample_stats' masked token statistics per sample: the aggregates over the loss-covered
-- tokens (loss_mask > 0) of each sample, train and eval, that sample_stats joins to `samples`.
-- Grain: one row per (run, rollout_id, evaluation, batch_position) with a token of
--        loss_mask > 0.
-- Inputs: tokens.
-- Settings: none.
-- NaN/inf propagate as in torch: DuckDB orders NaN above +inf, so MAX is NaN when any value
-- is; the means are kept in DOUBLE (a FLOAT cast of exp() would raise where torch gives inf).
-- Columns:
--   run               VARCHAR  run name
--   rollout_id        BIGINT   training step the dump belongs to
--   evaluation        BOOLEAN  true for rows from rollout_data/eval_{rid}.pt
--   batch_position    INTEGER  0-based position in the rollout dump's sample list
--   mean_entropy      DOUBLE   mean actor entropy (nats)
--   max_entropy       DOUBLE   max actor entropy (nats)
--   ref_entropy_mean  DOUBLE   mean reference-model entropy (nats)
--   mean_abs_lp_diff  DOUBLE   mean |lp_diff| (nats)
--   max_abs_lp_diff   DOUBLE   max |lp_diff| (nats)
--   mean_imp_ratio    DOUBLE   mean of exp(lp_diff)
--   adv_mean          DOUBLE   mean advantage
--   adv_std           DOUBLE   sample std (n - 1) of advantages; null for one token
--   return_mean       DOUBLE   mean return
CREATE OR REPLACE VIEW sample_token_parts AS
SELECT
    run::VARCHAR AS run,
    rollout_id::BIGINT AS rollout_id,
    evaluation::BOOLEAN AS evaluation,
    batch_position::INTEGER AS batch_position,
    AVG(entropy)::DOUBLE AS mean_entropy,
    MAX(entropy)::DOUBLE AS max_entropy,
    AVG(ref_entropy)::DOUBLE AS ref_entropy_mean,
    AVG(ABS(lp_diff))::DOUBLE AS mean_abs_lp_diff,
    MAX(ABS(lp_diff))::DOUBLE AS max_abs_lp_diff,
    AVG(EXP(lp_diff))::DOUBLE AS mean_imp_ratio,
    AVG(advantage)::DOUBLE AS adv_mean,
    STDDEV_SAMP(advantage)::DOUBLE AS adv_std,
    AVG(returns)::DOUBLE AS return_mean
FROM tokens
WHERE loss_mask > 0
GROUP BY run, rollout_id, evaluation, batch_position
