-- Per-sample summary: the reference reader's 30 summary columns (dump-format.md 6.2).
-- Grain: one row per run, rollout_id, evaluation, batch_position
-- Inputs: samples, tokens (base views)
-- Masked statistics use only loss-covered tokens (loss_mask > 0) of samples with a train side;
-- they are NULL when the sample has no train side, when no position is covered (removed or
-- all-masked samples, R = 0) or when the field is absent from the dump. NaN/inf propagate.
-- Columns:
--   run                    run name (partition)
--   rollout_id             training step the rollout dump belongs to (partition)
--   evaluation             true for rows from rollout_data/eval_{rid}.pt
--   batch_position         0-based position in the rollout dump's sample list
--   sample_index           Sample.index
--   group_index            GRPO prompt group (run-global); NULL for most eval samples
--   status                 completed / truncated / aborted / failed / pending
--   remove_sample          kept in the batch but excluded from the loss
--   response_length        R, response tokens (rollout side)
--   total_length           T, prompt + response tokens (rollout side)
--   reward                 float(Sample.reward) when numeric, else NULL
--   weight_version         last engine-reported weight version
--   weight_version_min     smallest all-digit weight version
--   mixed_version          more than one distinct weight version; NULL when none reported
--   staleness              rollout_id - weight_version_min (steps)
--   turns                  engine calls that reported a weight version
--   tool_calls             `tool` messages in a list prompt; NULL for string prompts
--   non_generation_time    seconds spent outside generation
--   spec_accept_rate       accepted / drafted speculative tokens
--   prefix_cache_hit_rate  cached / total prompt tokens
--   raw_reward             batch-global raw reward of the train dump; NULL without train side
--   normalized_reward      train-side (group-normalised) reward
--   truncated              train `truncated` flag, else status = 'truncated'
--   dumped_rank            lowest global rank whose train file holds the sample
--   mean_entropy           mean actor entropy over covered tokens (nats)
--   max_entropy            max actor entropy over covered tokens (nats)
--   ref_entropy_mean       mean reference-model entropy over covered tokens (nats)
--   mean_abs_lp_diff       mean |train_log_prob - rollout_log_prob| over covered tokens (nats)
--   max_abs_lp_diff        max |train_log_prob - rollout_log_prob| over covered tokens (nats)
--   mean_imp_ratio         mean of exp(lp_diff) over covered tokens (mean of ratios)
--   adv_mean               mean advantage over covered tokens
--   adv_std                sample std (n - 1) of advantages; NULL when one token is covered
--                          (the reference shows NaN there)
--   return_mean            mean return over covered tokens
--   alignment_failed       CP reassembly refused for this sample
--   has_train_row          some train file holds the sample
CREATE OR REPLACE VIEW sample_stats AS
WITH masked_stats AS (
    SELECT
        run,
        rollout_id,
        evaluation,
        batch_position,
        AVG(entropy) AS mean_entropy,
        MAX(entropy) AS max_entropy,
        AVG(ref_entropy) AS ref_entropy_mean,
        AVG(ABS(lp_diff)) AS mean_abs_lp_diff,
        -- DuckDB orders NaN above +inf, so MAX returns NaN when any value is NaN (as torch).
        MAX(ABS(lp_diff)) AS max_abs_lp_diff,
        -- Kept in DOUBLE: a FLOAT cast of exp() raises on overflow where torch gives inf.
        AVG(EXP(lp_diff)) AS mean_imp_ratio,
        AVG(advantage) AS adv_mean,
        STDDEV_SAMP(advantage) AS adv_std,
        AVG(returns) AS return_mean
    -- Aggregated per sample before the join with samples (which keeps only train-side samples),
    -- so the join sees one row per sample instead of one per token.
    FROM tokens
    WHERE loss_mask > 0
    GROUP BY
        run,
        rollout_id,
        evaluation,
        batch_position
)
SELECT
    s.run::VARCHAR AS run, -- run name
    s.rollout_id::BIGINT AS rollout_id, -- step
    s.evaluation::BOOLEAN AS evaluation, -- eval dump row
    s.batch_position::INTEGER AS batch_position, -- rollout-dump order
    s.sample_index::BIGINT AS sample_index, -- Sample.index
    s.group_index::BIGINT AS group_index, -- GRPO group
    s.status::VARCHAR AS status, -- sample status string
    s.remove_sample::BOOLEAN AS remove_sample, -- excluded from the loss
    s.response_length::INTEGER AS response_length, -- R (tokens)
    s.total_length::INTEGER AS total_length, -- T (tokens)
    s.reward::DOUBLE AS reward, -- raw numeric reward
    s.weight_version::VARCHAR AS weight_version, -- last weight version
    s.weight_version_min::BIGINT AS weight_version_min, -- min all-digit version
    s.mixed_version::BOOLEAN AS mixed_version, -- several weight versions
    s.staleness::BIGINT AS staleness, -- steps behind
    s.turns::BIGINT AS turns, -- engine calls
    s.tool_calls::BIGINT AS tool_calls, -- tool messages in the prompt
    s.non_generation_time::DOUBLE AS non_generation_time, -- seconds
    s.spec_accept_rate::DOUBLE AS spec_accept_rate, -- fraction
    s.prefix_cache_hit_rate::DOUBLE AS prefix_cache_hit_rate, -- fraction
    s.raw_reward::DOUBLE AS raw_reward, -- train-side raw reward
    s.normalized_reward::DOUBLE AS normalized_reward, -- group-normalised reward
    s.truncated::BOOLEAN AS truncated, -- hit the length limit
    s.dumped_rank::BIGINT AS dumped_rank, -- lowest holding rank
    m.mean_entropy::DOUBLE AS mean_entropy, -- nats
    m.max_entropy::DOUBLE AS max_entropy, -- nats
    m.ref_entropy_mean::DOUBLE AS ref_entropy_mean, -- nats
    m.mean_abs_lp_diff::DOUBLE AS mean_abs_lp_diff, -- nats
    m.max_abs_lp_diff::DOUBLE AS max_abs_lp_diff, -- nats
    m.mean_imp_ratio::DOUBLE AS mean_imp_ratio, -- ratio
    m.adv_mean::DOUBLE AS adv_mean, -- advantage units
    m.adv_std::DOUBLE AS adv_std, -- advantage units
    m.return_mean::DOUBLE AS return_mean, -- return units
    s.alignment_failed::BOOLEAN AS alignment_failed, -- CP reassembly refused
    s.has_train_row::BOOLEAN AS has_train_row -- train side present
FROM samples AS s
LEFT JOIN masked_stats AS m
    -- Only train-side samples count: their stat columns are NULL where loss_mask = 0, but a
    -- sample without a train side may carry a rollout mask and rollout log-probs.
    ON s.has_train_row
    AND m.run = s.run
    AND m.rollout_id = s.rollout_id
    AND m.evaluation = s.evaluation
    AND m.batch_position = s.batch_position
ORDER BY s.run, s.rollout_id, s.evaluation, s.batch_position
