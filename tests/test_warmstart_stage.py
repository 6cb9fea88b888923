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
