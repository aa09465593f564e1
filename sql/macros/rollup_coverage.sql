-- What the rollups keep for every setting a view applies at query time: the view reads the
-- stored rows while its setting is within these, and the tokens (a guarded fallback) beyond.
-- Macros:
--   histogram_half_widths()  the histogram_half_width values drift_histogram_parts bins for:
--                            1, 2 and 5 x 10^k nats for k = -3..1 (`tokenlake report` picks
--                            one of these; the default 0.1 is among them)
--   outliers_kept()          outlier ranks drift_outlier_parts keeps per step (100)
--   large_lp_diff_floor()    |delta| from which audit_token_rows keeps a loss-covered training
--                            token for the audit large_lp_diff (5 nats)
CREATE OR REPLACE MACRO histogram_half_widths() AS
    [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0]::DOUBLE[];
CREATE OR REPLACE MACRO outliers_kept() AS 100::BIGINT;
CREATE OR REPLACE MACRO large_lp_diff_floor() AS 5.0::DOUBLE;
