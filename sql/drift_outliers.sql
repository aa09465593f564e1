-- The worst tokens of each training step by |delta|, with where they sit and both log-probs.
-- Grain: one row per (run, rollout_id, outlier_rank), outlier_rank 1..outliers_per_step
--        (fewer when the step has fewer covered finite tokens). Non-finite tokens are not here;
--        the audit `nonfinite_log_probs` lists them.
-- Inputs: drift_outlier_parts, drift_tokens, drift_settings (outliers_per_step); macros
--         outliers_kept, outlier_rows (sql/macros).
-- The rollup drift_outlier_parts keeps each step's worst 100 (outliers_kept()); up to that
-- outliers_per_step reads them. Beyond it, the view ranks the tokens itself: max_by keeps each
-- step's worst tokens, ordered by (|delta| desc, batch_position, position) through a struct key.
-- Columns:
--   run               VARCHAR  run name
--   rollout_id        BIGINT   training step
--   outlier_rank      BIGINT   1 = largest |delta| in the step (ties: batch_position, position)
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
CREATE OR REPLACE VIEW drift_outliers AS
WITH worst AS (
    -- Only when outliers_per_step exceeds what the rollup keeps (the guard is empty otherwise,
    -- and DuckDB then skips this scan).
    SELECT live.* EXCLUDE (hit)
    FROM (
        SELECT
            t.run,
            t.rollout_id,
            MAX_BY(
                {
                    'batch_position': t.batch_position,
                    'sample_index': t.sample_index,
                    'position': t.position,
                    'token_id': t.token_id,
                    'train_log_prob': t.train_log_prob,
                    'rollout_log_prob': t.rollout_log_prob,
                    'lp_diff': t.lp_diff,
                    'abs_lp_diff': t.abs_lp_diff,
                    'ratio': t.ratio,
                    'entropy': t.entropy
                },
                -- Largest |delta| first; ties go to the lower batch_position, then position.
                {'abs_lp_diff': t.abs_lp_diff, 'batch_position': -t.batch_position, 'position': -t.position},
                s.outliers_per_step
            ) AS tops,
            1 AS hit
        FROM drift_tokens AS t
        CROSS JOIN drift_settings AS s
        GROUP BY t.run, t.rollout_id, s.outliers_per_step
    ) AS live
    JOIN (
        SELECT 1 AS hit FROM drift_settings WHERE NOT COALESCE(outliers_per_step <= outliers_kept(), false)
    ) AS g USING (hit)
),
ranked AS (
    SELECT
        run,
        rollout_id,
        GENERATE_SUBSCRIPTS(tops, 1) AS outlier_rank,
        UNNEST(tops) AS o
    FROM worst
),
outliers AS (
    SELECT p.*
    FROM drift_outlier_parts AS p
    CROSS JOIN drift_settings AS s
    WHERE COALESCE(s.outliers_per_step <= outliers_kept(), false)
        AND p.outlier_rank <= s.outliers_per_step
    UNION ALL
    SELECT
        run,
        rollout_id,
        outlier_rank,
        o.batch_position,
        o.sample_index,
        o.position,
        o.token_id,
        o.train_log_prob,
        o.rollout_log_prob,
        o.lp_diff,
        o.abs_lp_diff,
        o.ratio,
        o.entropy
    FROM ranked
)
SELECT * FROM outlier_rows(outliers)
ORDER BY run, rollout_id, outlier_rank
