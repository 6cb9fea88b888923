"""The warm start stage's inputs: which training tasks it demonstrates, and what its (machine-shared) key covers."""

from __future__ import annotations

from lego.config import load_config
from lego.pipeline.artifacts import StageContext
from lego.workdir import WorkDir


def test_the_warm_start_key_ignores_the_sampling_temperature_its_scripted_demonstrations_never_use(tmp_path):
    """Arms that sample RL at another temperature share one warm start; what can change a demonstration (a reply
    cut by max_tokens, the harness, the warm start's own settings) still changes the key."""
    from lego.pipeline.policy import Policy
    from lego.pipeline.warmstart_stage import warmstart_inputs

    policy = Policy.from_path(tmp_path / "policy", key="init")

    def key(*overrides: str) -> dict:
        config = load_config("test", list(overrides))
        ctx = StageContext(config=config, work=WorkDir.create(tmp_path / "work"), run_id="run-test", runner=None)
        return warmstart_inputs(ctx, [], policy)

    base = key()
    assert key("sampling.temperature=0.5", "sampling.top_p=0.9") == base
    for changed in ("sampling.max_tokens=64", "harness.max_turns=7", "warmstart.lr=0.5", "warmstart.tasks=3",
                    "project.seed=9"):
        assert key(changed) != base, changed


def test_the_warm_start_demonstrates_the_first_warmstart_tasks_training_tasks(tmp_path):
    """RL practises the others: tasks with no demonstration to replay."""
    from lego.pipeline.artifacts import StageResult
    from lego.pipeline.taskset_stage import write_tasks
    from lego.pipeline.warmstart_stage import demonstrated_tasks
    from lego.tasksets.family import family_tasks

    train = [task for task in family_tasks("constants", 0) if task.split == "train"][:5]
    listed = write_tasks(tmp_path / "train.jsonl", train)
    result = StageResult(stage="taskset", iteration=None, key="t", path=str(tmp_path), created_at="2026-01-01",
                         outputs={"train_tasks": str(listed)})

    def demonstrated(*overrides: str) -> list[str]:
        ctx = StageContext(config=load_config("test", list(overrides)), work=WorkDir.create(tmp_path / "work"),
                           run_id="run-test", runner=None)
        return [task.instance_id for task in demonstrated_tasks(ctx, result)]

    assert demonstrated() == [task.instance_id for task in train]
    assert demonstrated("warmstart.tasks=2") == [task.instance_id for task in train[:2]]
    assert demonstrated("warmstart.tasks=50") == [task.instance_id for task in train]


def test_rl_can_leave_out_the_demonstrated_tasks_and_the_config_says_when_it_cannot(tmp_path):
    """rollout.practise_demonstrated: false keeps RL's rollouts on the undemonstrated tasks; it needs a warm start
    that names its tasks, leaves some, and no filter picking RL's tasks too."""
    import pytest

    from lego.config import ConfigError
    from lego.pipeline.taskset_stage import practised
    from lego.tasksets.family import family_tasks
    from lego.tasksets.task import TaskSetError

    train = [task for task in family_tasks("constants", 0) if task.split == "train"][:5]
    ids = [task.instance_id for task in train]
    left_out = ["warmstart.enabled=true", "warmstart.tasks=2", "filter.enabled=false",
                "rollout.practise_demonstrated=false"]
    assert [t.instance_id for t in practised(load_config("test", left_out), train)] == ids[2:]
    assert [t.instance_id for t in practised(load_config("test", ["warmstart.tasks=2"]), train)] == ids
    with pytest.raises(TaskSetError, match="demonstrates all 5"):
        practised(load_config("test", [*left_out, "warmstart.tasks=5"]), train)
    with pytest.raises(ConfigError, match="warmstart.tasks"):
        load_config("test", ["warmstart.enabled=true", "filter.enabled=false", "rollout.practise_demonstrated=false"])
    with pytest.raises(ConfigError, match="filter.enabled"):
        load_config("test", [*left_out[:2], "filter.enabled=true", "rollout.practise_demonstrated=false"])


def test_the_rollout_stage_plans_only_the_practised_tasks_under_its_own_key(tmp_path):
    from lego.pipeline.artifacts import StageResult
    from lego.pipeline.policy import Policy
    from lego.pipeline.rollout_stage import plan_rollouts
    from lego.pipeline.taskset_stage import write_tasks
    from lego.tasksets.family import family_tasks

    train = [task for task in family_tasks("constants", 0) if task.split == "train"][:5]
    listed = write_tasks(tmp_path / "train.jsonl", train)
    result = StageResult(stage="taskset", iteration=None, key="t", path=str(tmp_path), created_at="2026-01-01",
                         outputs={"train_tasks": str(listed)})

    def plan(*overrides: str):
        config = load_config("test", ["warmstart.enabled=true", "warmstart.tasks=2", "filter.enabled=false",
                                      "rollout.samples_per_task=2", *overrides])
        ctx = StageContext(config=config, work=WorkDir.create(tmp_path / "work"), run_id="run-test", runner=None)
        return plan_rollouts(ctx, result, Policy.from_path(tmp_path / "policy", key="p"), 0)

    every, undemonstrated = plan(), plan("rollout.practise_demonstrated=false")
    assert sorted({r.task_id for r in every.requests}) == sorted(t.instance_id for t in train)
    assert sorted({r.task_id for r in undemonstrated.requests}) == sorted(t.instance_id for t in train[2:])
    assert len(undemonstrated.requests) == 6 and undemonstrated.key != every.key
