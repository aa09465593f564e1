-- The worst outliers_kept() (100) tokens of each training step by |delta|: drift_outliers
-- takes the first outliers_per_step of them.
-- Grain: one row per (run, rollout_id, outlier_rank), outlier_rank 1..100 (fewer when the
--        step has fewer covered finite tokens).
-- Order: |delta| descending, ties by batch_position, then position (as drift_outliers). The
--   100th largest |delta| of the step bounds the candidates; only those are ranked.
-- Inputs: drift_tokens; macros outliers_kept, outlier_rows (sql/macros).
-- Settings: none.
-- Columns:
--   run               VARCHAR  run name
--   rollout_id        BIGINT   training step
--   outlier_rank      BIGINT   1 = largest |delta| in the step
--   batch_position    INTEGER  sample's position in the rollout dump
--   sample_index      BIGINT   Sample.index
--   position          INTEGER  0-based response position
--   token_id          BIGINT   token id
--   train_log_prob    DOUBLE   trainer log-prob (nats)
--   rollout_log_prob  DOUBLE   engine log-prob (nats)
--   lp_diff           DOUBLE   delta (nats)
--   abs_lp_diff       DOUBLE   |delta| (nats)
--   ratio             DOUBLE   r = exp(delta)
--   entropy           DOUBLE   actor entropy (nats), null if not dumped
CREATE OR REPLACE VIEW drift_outlier_parts AS
WITH cutoff AS (
    -- MAX(x, n) lists the n largest, descending: its last is the smallest |delta| kept.
    SELECT run, rollout_id, MAX(abs_lp_diff, outliers_kept())[-1] AS min_abs_lp_diff
    FROM drift_tokens
    GROUP BY run, rollout_id
),
candidates AS (
    SELECT
        t.run,
        t.rollout_id,
        t.batch_position,
        t.sample_index,
        t.position,
        t.token_id,
        t.train_log_prob,
        t.rollout_log_prob,
        t.lp_diff,
        t.abs_lp_diff,
        t.ratio,
        t.entropy
    FROM drift_tokens AS t
    JOIN cutoff AS c
        ON t.run = c.run AND t.rollout_id = c.rollout_id AND t.abs_lp_diff >= c.min_abs_lp_diff
),
ranked AS (
    SELECT
        *,
        ROW_NUMBER() OVER (
            PARTITION BY run, rollout_id ORDER BY abs_lp_diff DESC, batch_position, position
        ) AS outlier_rank
    FROM candidates
    QUALIFY outlier_rank <= outliers_kept()
)
SELECT * FROM outlier_rows(ranked)
