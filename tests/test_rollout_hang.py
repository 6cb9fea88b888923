"""A harness that hangs (its model never answers) ends at the rollout's wall-clock limit as `timeout`, graded
agent_timeout, with its sandbox and proxy session closed: nothing leaks, nothing blocks the worker."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

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


HARNESSES = ("mini-swe-agent", "claude-code")


def _children_end(pid: int, within_s: float = 15.0) -> bool:
    """Whether the process `pid` has no live children within `within_s`."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        live = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[1] == str(pid) and fields[0] != "Z":
                live.append(stat.parent.name)
        if not live:
            return True
        time.sleep(0.1)
    return False  # beside the sandbox, and inside it


def test_hanging_harnesses_time_out_and_leak_nothing(lego_config, work_dir, docker_engine, base_image):
    """Both harnesses hang at once, each in a worker of its own: one wall-clock limit's wait checks both."""
    from lego.rollout.attempt import run_rollout
    from lego.sandbox.docker_sandbox import LABEL
    from lego.verify import Verifier

    for harness in HARNESSES:
        installed(harness)
    task = bundled_task()
    config = {harness: with_overrides(lego_config, harness={"name": harness, "max_turns": 3, "timeout_s": 30},
                                      rollout={"infra_retries": 0}) for harness in HARNESSES}
    engines = {harness: SilentEngine() for harness in HARNESSES}

    async def hang(harness):
        async with worker(config[harness], work_dir, docker_engine, base_image, engines[harness],
                          harness) as (adapter, res):
            trajectory = await run_rollout(task, adapter, resources=res, config=config[harness],
                                           rollout_id=f"hang-{harness}")
            if harness == "mini-swe-agent":  # a fork of the worker's forkserver: killed with its client
                assert res.forkserver is not None
                assert await asyncio.to_thread(_children_end, res.forkserver.process.pid), "the harness outlived it"
            return trajectory, dict(res.proxy._sessions)

    async def both():
        return await asyncio.gather(*(hang(harness) for harness in HARNESSES))

    results = dict(zip(HARNESSES, asyncio.run(asyncio.wait_for(both(), 240)), strict=True))
    for harness, (trajectory, open_sessions) in results.items():
        assert engines[harness].calls >= 1, harness
        assert trajectory.termination == TerminationReason.timeout, (harness, trajectory.harness_log[-2000:])
        assert not open_sessions, harness
        assert docker_engine.client.containers.list(
            all=True, filters={"label": [LABEL, f"lego.rollout=hang-{harness}"]}) == [], harness
        outcome = Verifier(docker_engine.client, base_image, lego_config.sandbox, lego_config.verify).verify(
            task, trajectory)
        assert outcome.kind == "agent_timeout" and outcome.reward == 0.0, harness
