"""A harness that hangs (its model never answers) ends at the rollout's wall-clock limit as `timeout`, graded
agent_timeout, with its sandbox and proxy session closed: nothing leaks, nothing blocks the worker."""

from __future__ import annotations

import asyncio

import pytest
from rollout_helpers import bundled_task, installed, with_overrides, worker

from lego.records import TerminationReason

pytestmark = pytest.mark.docker


class SilentEngine:
    """Never answers: the harness waits on its HTTP call until the rollout's time limit."""

    policy_version = 0
    max_context = 32768
    eos_token_ids = (151645,)

    def __init__(self) -> None:
        self.calls = 0

    async def generate(self, prompt_ids, sampling):
        self.calls += 1
        await asyncio.Event().wait()

    async def score(self, token_ids):
        return [0.0] * len(token_ids)

    def load_checkpoint(self, path, policy_version):
        self.policy_version = policy_version


@pytest.mark.parametrize("harness", ["mini-swe-agent", "claude-code"])  # beside the sandbox, and inside it
def test_a_hanging_harness_times_out_and_leaks_nothing(harness, lego_config, work_dir, docker_engine, base_image):
    from lego.sandbox.docker_sandbox import LABEL
    from lego.verify import Verifier

    installed(harness)
    task = bundled_task()
    config = with_overrides(lego_config, harness={"name": harness, "max_turns": 3, "timeout_s": 30},
                            rollout={"infra_retries": 0})
    engine = SilentEngine()

    async def go():
        from lego.rollout.attempt import run_rollout

        async with worker(config, work_dir, docker_engine, base_image, engine, harness) as (adapter, res):
            trajectory = await run_rollout(task, adapter, resources=res, config=config, rollout_id=f"hang-{harness}")
            return trajectory, dict(res.proxy._sessions)

    trajectory, open_sessions = asyncio.run(asyncio.wait_for(go(), 240))
    assert engine.calls >= 1
    assert trajectory.termination == TerminationReason.timeout, trajectory.harness_log[-2000:]
    assert not open_sessions
    assert docker_engine.client.containers.list(all=True, filters={"label": [LABEL, f"lego.rollout=hang-{harness}"]}) == []
    outcome = Verifier(docker_engine.client, base_image, config.sandbox, config.verify).verify(task, trajectory)
    assert outcome.kind == "agent_timeout" and outcome.reward == 0.0
