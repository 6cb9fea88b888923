-- Resolved rate per run, harness and policy version over evaluation attempts, with a Wilson score interval
-- (z from the configured confidence). infra_error attempts are excluded: they are not the policy's doing.
CREATE OR REPLACE VIEW eval_summary AS
WITH counts AS (
    SELECT
        run_id, harness, policy_version,
        max(iteration) AS iteration,
        count(*) FILTER (WHERE kind <> 'infra_error') AS attempts,
        count(*) FILTER (WHERE resolved) AS resolved,
        count(*) FILTER (WHERE kind = 'cheat') AS cheat,
        count(*) FILTER (WHERE kind = 'infra_error') AS infra_error,
        count(DISTINCT task_id) AS tasks
    FROM eval_results
    GROUP BY run_id, harness, policy_version
), rates AS (
    SELECT *, CASE WHEN attempts > 0 THEN resolved / attempts END AS resolved_rate, {{ z }} AS z FROM counts
)
SELECT
    *,
    CASE WHEN attempts > 0 THEN
        (resolved_rate + z * z / (2 * attempts)
         - z * sqrt(resolved_rate * (1 - resolved_rate) / attempts + z * z / (4 * attempts * attempts)))
        / (1 + z * z / attempts)
    END AS resolved_low,
    CASE WHEN attempts > 0 THEN
        (resolved_rate + z * z / (2 * attempts)
         + z * sqrt(resolved_rate * (1 - resolved_rate) / attempts + z * z / (4 * attempts * attempts)))
        / (1 + z * z / attempts)
    END AS resolved_high
FROM rates;
