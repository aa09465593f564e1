-- Histogram of delta = train - rollout log-prob per training step, with fixed bins.
-- Grain: one row per (run, rollout_id, bin) for every step with a covered finite token; all
--        102 bins are present (empty ones with tokens = 0), so steps line up for plotting.
-- Bins: 100 of width h / 50 over [-h, h), plus two open tails, with h =
--   drift_settings.histogram_half_width (0.1 nats: bins of 0.002; `tokenlake report` sets it
--   from the data's |delta| quantiles). A token goes to bin k = floor(delta * 50 / h) computed
--   in DOUBLE, clamped to [-51, 50]:
--   k = -51: (-inf, -h); -50 <= k <= 49: [k h / 50, (k + 1) h / 50); k = 50: [h, +inf).
-- Counts: from the rollup drift_histogram_parts, which bins every step for each half-width of
--   histogram_half_widths() (1, 2, 5 x 10^k nats, k = -3..1); for any other h the view bins
--   drift_tokens itself by the formula above.
-- Inputs: drift_histogram_parts, drift_tokens, drift_settings (histogram_half_width); macros
--         clamp_to, histogram_half_widths (sql/macros).
-- Columns:
--   run                  VARCHAR  run name
--   rollout_id           BIGINT   training step
--   bin                  INTEGER  k, -51..50
--   bin_low              DOUBLE   inclusive lower edge (nats; -inf for the low tail)
--   bin_high             DOUBLE   exclusive upper edge (nats; +inf for the high tail)
--   tokens               BIGINT   covered finite tokens in the bin
--   fraction             DOUBLE   tokens / the step's covered finite tokens
--   cumulative_fraction  DOUBLE   fraction of the step's tokens in this bin or below
CREATE OR REPLACE VIEW drift_histogram AS
WITH bins AS (
    SELECT range::INTEGER AS bin FROM RANGE(-51, 51)
),
counted AS MATERIALIZED (
    SELECT p.run, p.rollout_id, p.bin, p.tokens
    FROM drift_histogram_parts AS p
    JOIN drift_settings AS ds ON p.half_width = ds.histogram_half_width
    UNION ALL
    -- Only for a half-width the rollup does not hold (the guard is empty otherwise, and DuckDB
    -- then skips this scan).
    SELECT live.* EXCLUDE (hit)
    FROM (
        SELECT
            run,
            rollout_id,
            clamp_to(FLOOR(lp_diff * (50.0 / ds.histogram_half_width)), -51, 50)::INTEGER AS bin,
            COUNT(*) AS tokens,
            1 AS hit
        FROM drift_tokens
        CROSS JOIN drift_settings AS ds
        GROUP BY ALL
    ) AS live
    JOIN (
        SELECT 1 AS hit
        FROM drift_settings
        WHERE NOT COALESCE(list_contains(histogram_half_widths(), histogram_half_width), false)
    ) AS g USING (hit)
),
steps AS (
    -- The step totals from the bin counts, not from another pass over the tokens.
    SELECT run, rollout_id, SUM(tokens) AS step_tokens
    FROM counted
    GROUP BY run, rollout_id
),
filled AS (
    SELECT
        st.run,
        st.rollout_id,
        b.bin,
        COALESCE(c.tokens, 0) AS tokens,
        st.step_tokens
    FROM steps AS st
    CROSS JOIN bins AS b
    LEFT JOIN counted AS c
        ON c.run = st.run AND c.rollout_id = st.rollout_id AND c.bin = b.bin
)
SELECT
    run::VARCHAR AS run,
    rollout_id::BIGINT AS rollout_id,
    bin::INTEGER AS bin,
    (CASE WHEN bin = -51 THEN '-inf'::DOUBLE ELSE bin * (ds.histogram_half_width / 50.0) END)
        ::DOUBLE AS bin_low,
    (CASE WHEN bin = 50 THEN 'inf'::DOUBLE ELSE (bin + 1) * (ds.histogram_half_width / 50.0) END)
        ::DOUBLE AS bin_high,
    tokens::BIGINT AS tokens,
    (tokens / step_tokens)::DOUBLE AS fraction,
    (SUM(tokens) OVER (PARTITION BY run, rollout_id ORDER BY bin) / step_tokens)::DOUBLE
        AS cumulative_fraction
FROM filled
CROSS JOIN drift_settings AS ds
ORDER BY run, rollout_id, bin
