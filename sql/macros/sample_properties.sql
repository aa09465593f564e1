-- The one join of per-sample or per-token training rows with their sample in `samples`, as
-- the DuckDB table macro with_sample_properties: drift_samples (reward, staleness),
-- drift_sample_terms and drift_token_samples (what the per-sample breakdowns group on) all
-- select from it.
--
-- with_sample_properties(rows): `rows` names a relation of training-step rows keyed by run,
-- rollout_id and batch_position (drift_sample_parts, drift_tokens); the join reads the base
-- view `samples`.
-- Grain: one row per row of `rows`: its training sample (evaluation false) matches at most
--        once, and a row without one keeps its values, with null properties.
-- Columns: `rows`' own, then the sample's response_length, dumped_rank, staleness,
--   mixed_version, reward and raw_reward as `samples` types them.
CREATE OR REPLACE MACRO with_sample_properties(rows) AS TABLE
SELECT
    r.*,
    s.response_length,
    s.dumped_rank,
    s.staleness,
    s.mixed_version,
    s.reward,
    s.raw_reward
FROM query_table(rows) AS r
LEFT JOIN samples AS s
    ON s.run = r.run
    AND s.rollout_id = r.rollout_id
    AND NOT s.evaluation
    AND s.batch_position = r.batch_position;
