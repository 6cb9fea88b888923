"""Real harnesses solve a bundled task end to end under a scripted policy (the gold patch, as the model's tool
calls), through the proxy, in a sandbox; the verifier grades the final diff resolved in a fresh sandbox."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from rollout_helpers import (
    bundled_task,
    gold_command,
    gold_script,
    installed,
    tool_call,
    with_overrides,
    worker,
)

from lego.records import TerminationReason

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def scorer(tiny_model_path):
    from lego.engine.transformers_engine import TransformersEngine

    # Claude Code's first prompt is ~25k tokens: a context beyond the default 16k.
    engine = TransformersEngine(tiny_model_path, dtype="float32", max_batch_size=2, batch_wait_ms=1.0,
                                max_context=32768)
    yield engine
    engine.close()


def solve(harness, lego_config, work_dir, docker_engine, base_image, scorer, script=None):
    from lego.engine.scripted import ScriptedEngine
    from lego.engine.tokenizer import load_tokenizer
    from lego.rollout.attempt import run_rollout

    installed(harness)
    task = bundled_task()
    config = with_overrides(lego_config, harness={"name": harness, "max_turns": 6, "timeout_s": 240},
                            sampling={"max_tokens": 2048})
    engine = ScriptedEngine(scorer, load_tokenizer(), script or gold_script(harness, task))

    async def go():
        async with worker(config, work_dir, docker_engine, base_image, engine, harness) as (adapter, res):
            return await run_rollout(task, adapter, resources=res, config=config, rollout_id=f"scripted-{harness}")

    return task, asyncio.run(go())


def check_solved(task, trajectory, docker_engine, base_image, lego_config):
    from lego.verify.grader import Verifier

    assert trajectory.termination == TerminationReason.completed, trajectory.harness_log[-3000:]
    assert "+" in trajectory.final_diff and trajectory.error is None
    main = trajectory.main_segments
    assert main and sum(segment.num_sampled for segment in main) > 0
    assert all(call.error is None for call in trajectory.calls)
    assert trajectory.timings["sandbox_setup_s"] > 0 and trajectory.timings["model_s"] > 0
    assert trajectory.metadata["transcripts"], "the harness transcript was kept"
    outcome = Verifier(docker_engine.client, base_image, lego_config.sandbox, lego_config.verify).verify(
        task, trajectory)
    assert outcome.kind.value == "resolved", outcome
    return outcome


def test_mini_swe_agent_solves_a_task_and_looking_at_git_history_is_not_a_cheat(lego_config, work_dir, docker_engine,
                                                                               base_image, scorer):
    """It looks at the history first, then applies the gold patch: one rollout checks both."""
    task = bundled_task()
    look = "git log --all --oneline | head -5"
    script = ["Let me look at the history.\n" + tool_call("bash", {"command": look}),
              *gold_script("mini-swe-agent", task)]
    task, trajectory = solve("mini-swe-agent", lego_config, work_dir, docker_engine, base_image, scorer, script)
    outcome = check_solved(task, trajectory, docker_engine, base_image, lego_config)
    assert [call.protocol for call in trajectory.calls] == ["openai_chat"] * 3
    assert [call.kind for call in trajectory.calls] == ["start", "extend", "extend"]
    # The verifier's actions are the commands mini ran, read back from its trajectory.
    assert trajectory.metadata["actions"] == [look, gold_command(task), "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"]
    # The sandbox's history is the base commit alone: the look reveals nothing, so the fix is graded as a fix.
    assert outcome.cheat_rules == [], outcome


def test_claude_code_solves_a_task(lego_config, work_dir, docker_engine, base_image, scorer):
    task, trajectory = solve("claude-code", lego_config, work_dir, docker_engine, base_image, scorer)
    check_solved(task, trajectory, docker_engine, base_image, lego_config)
    assert {call.protocol for call in trajectory.calls} == {"anthropic_messages"}
    assert trajectory.num_turns == 2
    assert trajectory.metadata["actions"] == [gold_command(task)]  # its Bash tool_use, from the session JSONL


def test_openhands_solves_a_task_and_its_file_editor_paths_never_reach_the_host(lego_config, work_dir, docker_engine,
                                                                               base_image, scorer):
    """It looks with the terminal and fixes with the file editor (both must act inside the sandbox), then writes a
    note through a `..` path: the file editor works on a host mirror of container files, so that path must name
    the container's file (outside the repo, so no diff), never a file on the host."""
    import uuid

    task = bundled_task()
    name = f"lego-escape-{uuid.uuid4().hex}.txt"
    escape = f"{task.environment.workdir}/" + "../" * 16 + f"tmp/{name}"
    *fix, finish = gold_script("openhands", task)
    script = [*fix, "I will write a note.\n" + tool_call("file_editor", {"command": "create", "path": escape,
                                                                          "file_text": "escaped\n"}), finish]
    task, trajectory = solve("openhands", lego_config, work_dir, docker_engine, base_image, scorer, script)
    check_solved(task, trajectory, docker_engine, base_image, lego_config)
    assert {call.protocol for call in trajectory.calls} == {"openai_chat"}
    actions = trajectory.metadata["actions"]
    assert actions[0] == "git status --short && pwd" and actions[1].startswith("file_editor ")
    assert actions[2].startswith("file_editor ") and name in actions[2]
    assert actions[-1].startswith("finish ")
    events = Path(trajectory.metadata["transcripts"][0]).read_text()
    assert f'"working_dir":"{task.environment.workdir}"' in events  # the terminal's pwd: inside the container
    assert not Path("/tmp", name).exists()
    assert name not in trajectory.final_diff
