-- drift_histogram's bin counts for every half-width of histogram_half_widths(), so the view
-- answers from them under any of those (the default, and whatever `tokenlake report` picks).
-- Grain: one row per (run, rollout_id, half_width, bin) with at least one token; empty bins
--        are left out (drift_histogram fills them in).
-- Bins: exactly drift_histogram's: bin = clamp_to(floor(delta * (50.0 / half_width)), -51, 50).
--   One pass groups the tokens by the bin of the finest half-width w0 (0.001, with the tails
--   pushed out to where the widest half-width's tails begin), and each group is binned for
--   every half-width by that formula applied to its smallest delta. The bin is monotone in
--   delta, and every listed grid's edges are edges of the fine grid (50 / w is an integer
--   dividing 50 / w0, and a float32 delta times it is exact in DOUBLE), so a group never
--   straddles a bin and the counts equal binning every token.
-- Inputs: drift_tokens; macros clamp_to, histogram_half_widths (sql/macros).
-- Settings: none.
-- Columns:
--   run         VARCHAR  run name
--   rollout_id  BIGINT   training step
--   half_width  DOUBLE   h, one of histogram_half_widths() (nats)
--   bin         INTEGER  k, -51..50, as in drift_histogram for h
--   tokens      BIGINT   covered finite tokens in the bin
CREATE OR REPLACE VIEW drift_histogram_parts AS
WITH fine AS (
    -- 50 / 0.001 = 50000 fine bins per nat; the widest half-width (50) ends at 2.5e6 of them.
    SELECT
        run,
        rollout_id,
        clamp_to(FLOOR(lp_diff * (50.0 / 0.001::DOUBLE)), -2550000, 2500000)::INTEGER AS fine_bin,
        MIN(lp_diff) AS low,
        COUNT(*) AS tokens
    FROM drift_tokens
    GROUP BY ALL
),
widths AS (
    SELECT UNNEST(histogram_half_widths()) AS half_width
)
SELECT
    f.run::VARCHAR AS run,
    f.rollout_id::BIGINT AS rollout_id,
    w.half_width::DOUBLE AS half_width,
    clamp_to(FLOOR(f.low * (50.0 / w.half_width)), -51, 50)::INTEGER AS bin,
    SUM(f.tokens)::BIGINT AS tokens
FROM fine AS f
CROSS JOIN widths AS w
GROUP BY ALL
