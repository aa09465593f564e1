-- The typed columns of an outlier row, written once, as the DuckDB table macro outlier_rows:
-- the rollup drift_outlier_parts and the view drift_outliers (which reads that rollup, and
-- ranks the tokens itself beyond what it keeps) both select their rows through it.
--
-- outlier_rows(ranked): `ranked` names a relation (a CTE) with the columns run, rollout_id,
-- outlier_rank, batch_position, sample_index, position, token_id, train_log_prob,
-- rollout_log_prob, lp_diff, abs_lp_diff, ratio, entropy.
-- Grain: one row per row of `ranked`.
-- Columns: drift_outlier_parts' own (sql/rollups/drift_outlier_parts.sql gives each type and
--   unit), in that order.
CREATE OR REPLACE MACRO outlier_rows(ranked) AS TABLE
SELECT
    run::VARCHAR AS run,
    rollout_id::BIGINT AS rollout_id,
    outlier_rank::BIGINT AS outlier_rank,
    batch_position::INTEGER AS batch_position,
    sample_index::BIGINT AS sample_index,
    position::INTEGER AS position,
    token_id::BIGINT AS token_id,
    train_log_prob::DOUBLE AS train_log_prob,
    rollout_log_prob::DOUBLE AS rollout_log_prob,
    lp_diff::DOUBLE AS lp_diff,
    abs_lp_diff::DOUBLE AS abs_lp_diff,
    ratio::DOUBLE AS ratio,
    entropy::DOUBLE AS entropy
FROM query_table(ranked);
