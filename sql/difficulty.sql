-- Task difficulty: the pass rate of each task over the attempts made at the filter stage, at the policy's
-- sampling temperature. infra_error attempts (and ungraded ones) are left out of the denominator: they say
-- nothing about the task. A task is kept when its pass rate lies in [min_solved/k, max_solved/k]
-- (default: solved in 1 to k-1 of k), compared exactly with integers: solved*k between min*valid and max*valid.
CREATE OR REPLACE VIEW task_difficulty AS
WITH attempts AS (
    SELECT r.run_id, r.task_id, r.rollout_id, o.kind
    FROM rollouts AS r
    LEFT JOIN latest_outcomes AS o ON o.run_id = r.run_id AND o.rollout_id = r.rollout_id
    WHERE r.stage = {{ stage }}
      AND (r.temperature IS NULL OR {{ temperature }} IS NULL OR r.temperature = {{ temperature }})
), counts AS (
    SELECT
        run_id,
        task_id,
        count(*) AS attempts,
        count(*) FILTER (WHERE kind IS NOT NULL AND kind <> 'infra_error') AS valid_attempts,
        count(*) FILTER (WHERE kind = 'resolved') AS solved,
        count(*) FILTER (WHERE kind = 'infra_error') AS infra_errors,
        count(*) FILTER (WHERE kind IS NULL) AS ungraded
    FROM attempts
    GROUP BY run_id, task_id
)
SELECT
    *,
    CASE WHEN valid_attempts > 0 THEN solved / valid_attempts END AS pass_rate,
    {{ k }} AS k,
    {{ min_solved }} AS min_solved,
    {{ max_solved }} AS max_solved,
    CASE
        WHEN valid_attempts = 0 THEN 'no_valid_attempts'
        WHEN solved * {{ k }} < {{ min_solved }} * valid_attempts THEN 'too_hard'
        WHEN solved * {{ k }} > {{ max_solved }} * valid_attempts THEN 'too_easy'
        ELSE 'keep'
    END AS verdict,
    verdict = 'keep' AS keep
FROM counts;
