-- The user's tags of each run (`tokenlake extract --tag`, `--meta`, `tokenlake tag`), one per row.
-- Grain: one row per run, key (a run without tags has no row)
-- Inputs: runs (its tags_json object)
-- Join it to any view on `run`, e.g. drift_steps JOIN run_tags USING (run) WHERE key = 'precision'.
-- Columns:
--   run    VARCHAR  run name (partition)
--   key    VARCHAR  tag key (letters, digits, `_ . - /`; starts with a letter or `_`)
--   value  VARCHAR  tag value (text; numbers and booleans from --meta as their JSON text)
CREATE OR REPLACE VIEW run_tags AS
WITH entries AS (
    SELECT
        run,
        UNNEST(MAP_ENTRIES(JSON_TRANSFORM(tags_json, '"MAP(VARCHAR, VARCHAR)"'))) AS entry
    FROM runs
    WHERE tags_json IS NOT NULL
)
SELECT
    run::VARCHAR AS run,
    entry.key::VARCHAR AS key,
    entry.value::VARCHAR AS value
FROM entries;
