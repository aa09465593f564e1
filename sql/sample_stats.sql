-- Per-sample summary: the reference reader's 30 summary columns (dump-format.md 6.2).
-- Grain: one row per run, rollout_id, evaluation, batch_position
-- Inputs: samples (base view), sample_token_parts (rollup of the masked token statistics)
-- Masked statistics use only loss-covered tokens (loss_mask > 0) of samples with a train side;
-- they are NULL when the sample has no train side, when no position is covered (removed or
-- all-masked samples, R = 0) or when the field is absent from the dump. NaN/inf propagate.
-- Columns:
--   run                    VARCHAR  run name (partition)
--   rollout_id             BIGINT   training step the rollout dump belongs to (partition)
--   evaluation             BOOLEAN  true for rows from rollout_data/eval_{rid}.pt
--   batch_position         INTEGER  0-based position in the rollout dump's sample list
--   sample_index           BIGINT   Sample.index
--   group_index            BIGINT   GRPO prompt group (run-global); NULL for most eval samples
--   status                 VARCHAR  completed / truncated / aborted / failed / pending
--   remove_sample          BOOLEAN  kept in the batch but excluded from the loss
--   response_length        INTEGER  R, response tokens (rollout side)
--   total_length           INTEGER  T, prompt + response tokens (rollout side)
--   reward                 DOUBLE   float(Sample.reward) when numeric, else NULL
--   weight_version         VARCHAR  last engine-reported weight version
--   weight_version_min     BIGINT   smallest all-digit weight version
--   mixed_version          BOOLEAN  more than one distinct weight version; NULL when none reported
--   staleness              BIGINT   rollout_id - weight_version_min (steps)
--   turns                  BIGINT   engine calls that reported a weight version
--   tool_calls             BIGINT   `tool` messages in a list prompt; NULL for string prompts
--   non_generation_time    DOUBLE   seconds spent outside generation
--   spec_accept_rate       DOUBLE   accepted / drafted speculative tokens
--   prefix_cache_hit_rate  DOUBLE   cached / total prompt tokens
--   raw_reward             DOUBLE   batch-global raw reward of the train dump; NULL without train
--                                   side
--   normalized_reward      DOUBLE   train-side (group-normalised) reward
--   truncated              BOOLEAN  train `truncated` flag, else status = 'truncated'
--   dumped_rank            BIGINT   lowest global rank whose train file holds the sample
--   mean_entropy           DOUBLE   mean actor entropy over covered tokens (nats)
--   max_entropy            DOUBLE   max actor entropy over covered tokens (nats)
--   ref_entropy_mean       DOUBLE   mean reference-model entropy over covered tokens (nats)
--   mean_abs_lp_diff       DOUBLE   mean |train_log_prob - rollout_log_prob| over covered tokens
--                                   (nats)
--   max_abs_lp_diff        DOUBLE   max |train_log_prob - rollout_log_prob| over covered tokens
--                                   (nats)
--   mean_imp_ratio         DOUBLE   mean of exp(lp_diff) over covered tokens (mean of ratios)
--   adv_mean               DOUBLE   mean advantage over covered tokens
--   adv_std                DOUBLE   sample std (n - 1) of advantages; NULL when one token is
--                                   covered (the reference shows NaN there)
--   return_mean            DOUBLE   mean return over covered tokens
--   alignment_failed       BOOLEAN  CP reassembly refused for this sample
--   has_train_row          BOOLEAN  some train file holds the sample
CREATE OR REPLACE VIEW sample_stats AS
SELECT
    s.run::VARCHAR AS run,
    s.rollout_id::BIGINT AS rollout_id,
    s.evaluation::BOOLEAN AS evaluation,
    s.batch_position::INTEGER AS batch_position,
    s.sample_index::BIGINT AS sample_index,
    s.group_index::BIGINT AS group_index,
    s.status::VARCHAR AS status,
    s.remove_sample::BOOLEAN AS remove_sample,
    s.response_length::INTEGER AS response_length,
    s.total_length::INTEGER AS total_length,
    s.reward::DOUBLE AS reward,
    s.weight_version::VARCHAR AS weight_version,
    s.weight_version_min::BIGINT AS weight_version_min,
    s.mixed_version::BOOLEAN AS mixed_version,
    s.staleness::BIGINT AS staleness,
    s.turns::BIGINT AS turns,
    s.tool_calls::BIGINT AS tool_calls,
    s.non_generation_time::DOUBLE AS non_generation_time,
    s.spec_accept_rate::DOUBLE AS spec_accept_rate,
    s.prefix_cache_hit_rate::DOUBLE AS prefix_cache_hit_rate,
    s.raw_reward::DOUBLE AS raw_reward,
    s.normalized_reward::DOUBLE AS normalized_reward,
    s.truncated::BOOLEAN AS truncated,
    s.dumped_rank::BIGINT AS dumped_rank,
    m.mean_entropy::DOUBLE AS mean_entropy,
    m.max_entropy::DOUBLE AS max_entropy,
    m.ref_entropy_mean::DOUBLE AS ref_entropy_mean,
    m.mean_abs_lp_diff::DOUBLE AS mean_abs_lp_diff,
    m.max_abs_lp_diff::DOUBLE AS max_abs_lp_diff,
    m.mean_imp_ratio::DOUBLE AS mean_imp_ratio,
    m.adv_mean::DOUBLE AS adv_mean,
    m.adv_std::DOUBLE AS adv_std,
    m.return_mean::DOUBLE AS return_mean,
    s.alignment_failed::BOOLEAN AS alignment_failed,
    s.has_train_row::BOOLEAN AS has_train_row
FROM samples AS s
-- The rollup is aggregated per sample, so the join sees one row per sample, not one per token.
LEFT JOIN sample_token_parts AS m
    -- Only train-side samples count: their stat columns are NULL where loss_mask = 0, but a
    -- sample without a train side may carry a rollout mask and rollout log-probs.
    ON s.has_train_row
    AND m.run = s.run
    AND m.rollout_id = s.rollout_id
    AND m.evaluation = s.evaluation
    AND m.batch_position = s.batch_position
ORDER BY s.run, s.rollout_id, s.evaluation, s.batch_position
