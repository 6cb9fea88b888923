"""The verl agent loop: registration, Trajectory -> AgentLoopOutput through verl's own types, the server engine."""
# ruff: noqa: F811  (pytest fixtures imported from fixtures_model are parameters here)

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from fixtures_model import fp32_engine, tiny_model_path, tiny_tokenizer  # noqa: F401

from lego.engine.base import SamplingParams
from lego.records import LLMCall, Segment, Trajectory


@pytest.fixture(scope="module")
def verl_loop():
    """The module under test, imported by the tests that use it (it imports verl, which collection need not pay)."""
    import lego.train.verl_agent_loop as module

    return module


PROMPT = [151644, 872, 198, 9707, 11, 1879, 0, 151645, 198, 151644, 77091, 198]
TOOL = [151645, 198, 151644, 872, 198, 1986, 374, 151645, 198, 151644, 77091, 198]


def two_turn_trajectory(engine) -> Trajectory:
    """A real two-call rollout: sampled tokens (mask 1), a tool result (mask 0), sampled tokens again."""
    first = asyncio.run(engine.generate(PROMPT, SamplingParams(max_tokens=5, seed=0)))
    history = PROMPT + first.token_ids + TOOL
    second = asyncio.run(engine.generate(history, SamplingParams(max_tokens=4, seed=1)))
    tokens = history + second.token_ids
    mask = [0] * len(PROMPT) + [1] * 5 + [0] * len(TOOL) + [1] * 4
    logprobs = [0.0] * len(PROMPT) + first.logprobs + [0.0] * len(TOOL) + second.logprobs
    segment = Segment(np.array(tokens, dtype=np.int32), np.array(mask, dtype=np.uint8),
                      np.array(logprobs, dtype=np.float32), second.routed_experts)
    calls = [LLMCall(i, "openai_chat", 0.0, 0.1, 0, 0, "length", 0, "extend") for i in range(2)]
    return Trajectory("r1", "task-1", "mini-swe-agent", 3, segments=[segment], calls=calls)


def test_the_loop_is_registered_with_verl(verl_loop):
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    assert _agent_loop_registry["lego_harness"]["_target_"] == "lego.train.verl_agent_loop.LegoHarnessAgentLoop"


def test_trajectory_round_trips_through_agent_loop_output(fp32_engine, verl_loop):
    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

    trajectory = two_turn_trajectory(fp32_engine)
    segment = trajectory.segments[0]
    output = verl_loop.trajectory_to_output(trajectory, reward=1.0)
    output = AgentLoopOutput.model_validate(output.model_dump())  # survives verl's (de)serialisation
    tensors = output.as_dict()
    assert tensors["prompts"].tolist() == PROMPT
    assert torch.cat([tensors["prompts"], tensors["responses"]]).tolist() == segment.token_ids.tolist()
    assert tensors["response_mask"].tolist() == segment.response_mask[len(PROMPT):].tolist()
    np.testing.assert_allclose(tensors["rollout_log_probs"].numpy(), segment.logprobs[len(PROMPT):])
    assert tensors["routed_experts"].dtype == torch.int16
    np.testing.assert_array_equal(tensors["routed_experts"].numpy(), segment.routed_experts)
    assert tensors["rm_scores"][-1] == 1.0 and tensors["rm_scores"][:-1].abs().sum() == 0
    assert output.num_turns == 2 and output.extra_fields["policy_version"] == 3


def test_response_length_cuts_response_and_routing(fp32_engine, verl_loop):
    trajectory = two_turn_trajectory(fp32_engine)
    output = verl_loop.trajectory_to_output(trajectory, reward=0.0, response_length=7)
    assert len(output.response_ids) == len(output.response_mask) == len(output.response_logprobs) == 7
    assert np.asarray(output.routed_experts).shape[0] == len(PROMPT) + 7


def test_a_trajectory_without_samples_is_refused(verl_loop):
    segment = Segment(np.arange(4, dtype=np.int32), np.zeros(4, dtype=np.uint8), np.zeros(4, dtype=np.float32), None)
    with pytest.raises(verl_loop.AgentLoopError, match="no sampled token"):
        verl_loop.trajectory_to_output(Trajectory("r", "t", "h", 0, segments=[segment]), 0.0)


class TransformersServer:
    """verl's server-client call shape (generate -> TokenOutput) served by the real TransformersEngine."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.requests = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **_):
        from verl.workers.rollout.replica import TokenOutput

        self.requests.append(dict(sampling_params))
        sampling = SamplingParams(temperature=sampling_params["temperature"], top_p=sampling_params["top_p"],
                                  max_tokens=sampling_params["max_tokens"], seed=sampling_params.get("seed"),
                                  stop_token_ids=tuple(sampling_params["stop_token_ids"]))
        result = await self.engine.generate(prompt_ids, sampling)
        routed = result.routed_experts[:-1]  # like vLLM: the last sampled token was never fed
        return TokenOutput(token_ids=result.token_ids, log_probs=result.logprobs, routed_experts=routed)


def test_the_agent_loop_runs_an_injected_rollout_through_verls_server_client(fp32_engine, tiny_tokenizer, verl_loop):
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap

    from lego.tasksets.task import Task

    server = TransformersServer(fp32_engine)
    seen = {}

    async def rollout(task, engine):
        seen["task"] = task
        result = await engine.generate(PROMPT, SamplingParams(max_tokens=6, seed=4))
        seen["result"] = result
        segment = Segment(np.array(PROMPT + result.token_ids, dtype=np.int32),
                          np.array([0] * len(PROMPT) + [1] * 6, dtype=np.uint8),
                          np.array([0.0] * len(PROMPT) + result.logprobs, dtype=np.float32), result.routed_experts)
        return Trajectory("r2", task.instance_id, "mini-swe-agent", 0, segments=[segment]), 0.0

    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"prompt_length": 64, "response_length": 32}}})
    loop = verl_loop.LegoHarnessAgentLoop(
        trainer_config=DictConfigWrap(config), server_manager=server, tokenizer=tiny_tokenizer, processor=None,
        dataset_cls=None, data_config=DictConfigWrap(OmegaConf.create({})), run_rollout=rollout)
    task = Task(instance_id="demo-1", repo="demo/repo", base_commit="abc", problem_statement="fix it",
                FAIL_TO_PASS=["tests/test_demo.py::test_fix"])
    output = asyncio.run(loop.run({"temperature": 1.0}, extra_info={"task": task.model_dump()}))
    assert seen["task"] == task
    assert server.requests[0]["logprobs"] is True and server.requests[0]["max_tokens"] == 6
    assert output.response_ids == seen["result"].token_ids
    routed = np.asarray(output.routed_experts)
    assert routed.shape[0] == len(PROMPT) + 6 and not routed[-1].any()  # the unfed last row is zeros
    ref = asyncio.run(fp32_engine.generate(PROMPT, SamplingParams(max_tokens=6, seed=4)))
    np.testing.assert_array_equal(routed[:-1], ref.routed_experts[:-1])
