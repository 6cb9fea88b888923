-- GRPO outcome advantages, with the semantics of verl's compute_grpo_outcome_advantage:
--   group = (run, iteration, task); advantage = (reward - mean) / (std + epsilon), or reward - mean
--   when norm_adv_by_std is off; std is the unbiased sample std (torch.std); a one-sample group has
--   mean 0 and std 1.
-- Lego's rules on top: a sample without a reward (infra_error, or not graded yet) is excluded from the loss
-- AND from its group's statistics; a group with fewer than min_valid valid samples is dropped; cheat samples
-- count as reward 0 and are flagged (is_cheat). Every rollout of the stage has a row; in_loss says which train.
CREATE OR REPLACE VIEW advantages AS
WITH samples AS (
    SELECT
        r.run_id, r.iteration, r.task_id, r.rollout_id, r.sample_index, r.policy_version, r.harness,
        o.kind,
        coalesce(o.is_cheat, false) AS is_cheat,
        CASE WHEN o.is_cheat THEN 0.0 ELSE o.reward END AS reward,
        o.reward IS NOT NULL AS valid
    FROM rollouts AS r
    LEFT JOIN latest_outcomes AS o ON o.run_id = r.run_id AND o.rollout_id = r.rollout_id
    WHERE r.stage = {{ stage }}
), groups AS (
    SELECT
        run_id, iteration, task_id,
        count(*) AS group_size,
        count(*) FILTER (WHERE valid) AS group_valid,
        avg(reward) FILTER (WHERE valid) AS valid_mean,
        stddev_samp(reward) FILTER (WHERE valid) AS valid_std
    FROM samples
    GROUP BY run_id, iteration, task_id
), stats AS (
    SELECT
        *,
        CASE WHEN group_valid = 1 THEN 0.0 ELSE valid_mean END AS group_mean,
        CASE WHEN group_valid = 1 THEN 1.0 ELSE valid_std END AS group_std
    FROM groups
)
SELECT
    s.run_id, s.iteration, s.task_id, s.rollout_id, s.sample_index, s.policy_version, s.harness,
    s.kind, s.reward, s.is_cheat,
    g.group_size, g.group_valid, g.group_mean, g.group_std,
    s.valid AND g.group_valid >= {{ min_valid }} AS in_loss,
    CASE
        WHEN s.kind IS NULL THEN 'not_graded'
        WHEN NOT s.valid THEN 'infra_error'
        WHEN g.group_valid < {{ min_valid }} THEN 'group_too_small'
    END AS excluded_reason,
    CASE WHEN s.valid AND g.group_valid >= {{ min_valid }} THEN
        CASE WHEN {{ norm_by_std }}
            THEN (s.reward - g.group_mean) / (g.group_std + {{ epsilon }})
            ELSE s.reward - g.group_mean
        END
    END AS advantage
FROM samples AS s
JOIN stats AS g USING (run_id, iteration, task_id);
