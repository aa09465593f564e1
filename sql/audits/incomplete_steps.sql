-- Training steps extracted although their files were incomplete once they had settled: rank
-- files missing from the layout the run's other steps declare (miles, slime format 1), or a
-- NeMo-RL batch with fewer samples than the run's other steps. Their per-step statistics
-- cover only the samples that were there (pipeline/tokenlake/read/completeness.py).
-- Severity: warning
-- Grain: one row per incomplete step (run, rollout_id).
-- Rule: the step's manifest records what was missing. Parameters: none.
-- Inputs: incomplete_steps() (from the manifests).
SELECT
    run,
    rollout_id,
    missing
FROM incomplete_steps()
ORDER BY run, rollout_id
