-- Scalar macros shared by the drift views and audits: each formula is written once, here.
-- The catalog creates every sql/macros/*.sql before the views (pipeline/tokenlake/serve/catalog.py), and the
-- macros are stored in the catalog, so a DuckDB client that opens it can call them too.
-- Macros:
--   clamp_to(x, low, high)  x limited to [low, high]
--   clamp_abs(x, c)         x limited to [-c, c]
--   k3_term(d)              exp(d) - 1 - d: the k3 KL estimator of one token (nats; d in nats)
--   ess_fraction(m1, m2)    m1^2 / m2 for m1 = mean(w), m2 = mean(w^2): the effective sample
--                           size as a fraction in (0, 1] (= 1 / mean((w / mean(w))^2))
--   log2_bucket(x)          floor(log2(x)) as INTEGER: bucket b holds x in [2^b, 2^(b+1))
--   drift_covered(loss_mask, lp_diff)  a training token the drift statistics cover: in the
--                           loss (loss_mask > 0) with both log-probs (lp_diff not null)
--   drift_finite(lp_diff, train_log_prob, rollout_log_prob)  all three finite; drift_tokens
--                           holds the covered finite tokens, drift_steps counts the others
CREATE OR REPLACE MACRO clamp_to(x, low, high) AS GREATEST(LEAST(x, high), low);
CREATE OR REPLACE MACRO clamp_abs(x, c) AS GREATEST(LEAST(x, c), -c);
CREATE OR REPLACE MACRO k3_term(d) AS EXP(d) - 1.0 - d;
CREATE OR REPLACE MACRO ess_fraction(m1, m2) AS m1 * m1 / m2;
CREATE OR REPLACE MACRO log2_bucket(x) AS FLOOR(LOG2(x))::INTEGER;
CREATE OR REPLACE MACRO drift_covered(loss_mask, lp_diff) AS loss_mask > 0 AND lp_diff IS NOT NULL;
CREATE OR REPLACE MACRO drift_finite(lp_diff, train_log_prob, rollout_log_prob) AS
    ISFINITE(lp_diff) AND ISFINITE(train_log_prob) AND ISFINITE(rollout_log_prob);
