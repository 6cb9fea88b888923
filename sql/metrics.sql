-- Per run, stage and iteration: rollouts, tokens, outcome counts and mean reward (infra errors have no reward
-- and so do not enter the mean).
CREATE OR REPLACE VIEW iteration_summary AS
SELECT
    r.run_id,
    r.stage,
    r.iteration,
    count(*) AS rollouts,
    CAST(coalesce(sum(r.num_tokens), 0) AS BIGINT) AS tokens,
    CAST(coalesce(sum(r.num_response_tokens), 0) AS BIGINT) AS response_tokens,
    count(*) FILTER (WHERE o.kind = 'resolved') AS resolved,
    count(*) FILTER (WHERE o.kind IN ('unresolved', 'agent_timeout', 'overlong')) AS unresolved,
    count(*) FILTER (WHERE o.kind = 'cheat') AS cheat,
    count(*) FILTER (WHERE o.kind = 'infra_error') AS infra_error,
    count(*) FILTER (WHERE o.kind IS NULL) AS ungraded,
    avg(o.reward) AS mean_reward
FROM rollouts AS r
LEFT JOIN latest_outcomes AS o ON o.run_id = r.run_id AND o.rollout_id = r.rollout_id
GROUP BY r.run_id, r.stage, r.iteration;

-- Per run and iteration: the trainer's steps.
CREATE OR REPLACE VIEW train_summary AS
SELECT run_id, iteration, count(*) AS steps, CAST(sum(num_tokens) AS BIGINT) AS tokens, avg(loss) AS mean_loss,
       max(policy_version) AS policy_version
FROM train_steps
GROUP BY run_id, iteration;
