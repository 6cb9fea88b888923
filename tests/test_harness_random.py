"""Each CLI/Python harness completes a rollout under the tiny random policy: the proxy serves it, the rollout ends
with the right termination reason, nothing leaks (no container left, the session closed)."""

from __future__ import annotations

import asyncio

import pytest
from rollout_helpers import bundled_task, installed, with_overrides, worker

from lego.records import TerminationReason

pytestmark = pytest.mark.docker

# Random text has no tool call: mini re-prompts (format errors) until its step limit; the CLI agents take a reply
# without a tool call as their final answer.
EXPECTED = {
    "mini-swe-agent": {TerminationReason.max_turns},
    "claude-code": {TerminationReason.completed, TerminationReason.max_turns},
    "opencode": {TerminationReason.completed, TerminationReason.max_turns},
    "codex": {TerminationReason.completed, TerminationReason.max_turns},
    # A reply without a tool call finishes the conversation (status finished); else MaxIterationsReached.
    "openhands": {TerminationReason.completed, TerminationReason.max_turns},
}


@pytest.fixture(scope="module")
def random_engine(tiny_model_path):
    from lego.engine.transformers_engine import TransformersEngine

    engine = TransformersEngine(tiny_model_path, dtype="bfloat16", max_batch_size=2, batch_wait_ms=1.0,
                                max_context=32768)
    yield engine
    engine.close()


@pytest.mark.parametrize("harness", sorted(EXPECTED))
def test_random_policy_rollout(harness, lego_config, work_dir, docker_engine, base_image, random_engine):
    from lego.rollout.attempt import run_rollout
    from lego.sandbox.docker_sandbox import LABEL

    installed(harness)
    task = bundled_task()
    config = with_overrides(lego_config, harness={"name": harness, "max_turns": 2, "timeout_s": 180},
                            sampling={"max_tokens": 12})

    async def go():
        async with worker(config, work_dir, docker_engine, base_image, random_engine, harness) as (adapter, res):
            trajectory = await run_rollout(task, adapter, resources=res, config=config,
                                           rollout_id=f"random-{harness}")
            return trajectory, res.proxy._sessions

    trajectory, open_sessions = asyncio.run(go())
    assert trajectory.termination in EXPECTED[harness], (trajectory.termination, trajectory.harness_log[-3000:])
    assert trajectory.error is None and trajectory.metadata["attempts"] == 1
    served = [call for call in trajectory.calls if call.error is None and call.kind != "subagent"]
    assert 1 <= len(served) <= config.harness.max_turns
    if trajectory.metadata["turn_guard_tripped"]:  # the call after the limit was refused, not served
        assert trajectory.termination == TerminationReason.max_turns and trajectory.calls[-1].error
    assert all(call.completion_tokens <= 12 for call in trajectory.calls)
    assert trajectory.main_segments and trajectory.main_segments[0].num_sampled > 0
    assert trajectory.final_diff == ""  # random text changes nothing
    assert not open_sessions
    rollout_containers = docker_engine.client.containers.list(
        all=True, filters={"label": [LABEL, "lego.rollout=random-" + harness]})
    assert rollout_containers == []
