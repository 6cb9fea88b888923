"""OpenHands, the V1 SDK (PyPI `openhands-sdk` + `openhands-tools`), beside the sandbox.

The SDK needs Python 3.12 (its own cached venv; a 3.12 interpreter must exist on the machine: python3.12 on PATH
or a pyenv install). It runs on the host (runners/openhands_runner.py) with the SDK's default CLI agent; its
terminal is the SDK's own PTY session on a `bash -i` inside the sandbox container (runners/docker_shell.py) and its
file editor is the SDK's own, acting on the container's files (see the runner). Model calls: OpenAI chat
completions, non-streaming, native tool calling, to the proxy session on the host's loopback.
It ends when the model calls `finish` or answers without a tool call (status finished), when its stuck detector
stops it (stuck: its own ending, counted as completed), or at max_iteration_per_run = max_turns
(MaxIterationsReached). Its events are the transcript (JSON lines), read back for the verifier's actions.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from lego.harness.base import (
    MODEL_NAME,
    HarnessContext,
    HarnessLaunch,
    HarnessRunResult,
    HarnessSpec,
    action_of,
    json_lines,
    parse_arguments,
    tool_call,
)
from lego.harness.mini_swe_agent import result_line
from lego.records import TerminationReason

RUNNER = Path(__file__).parent / "runners" / "openhands_runner.py"
RUNTIME_FILES = (RUNNER, RUNNER.parent / "docker_shell.py")  # run, not imported (lego.pipeline.keys)
class OpenHands:
    spec = HarnessSpec(
        name="openhands", protocol="openai_chat", default_version="1.58.2", install_kind="venv",
        packages=("openhands-sdk=={version}", "openhands-tools=={version}", "docker>=7.1"), python="3.12",
        runs="beside", prompt_via="the task text in a JSON spec file, sent as the conversation's first message",
        ends_by=("exit", "max_turns", "time_limit"),
        transcript="the conversation's events as JSON lines in the rollout's host scratch dir",
        optional=True,  # a 500 MB venv on Python 3.12, which not every machine has
    )

    def launch(self, context: HarnessContext) -> HarnessLaunch:
        transcript = context.scratch / "openhands.events.jsonl"
        spec_path = context.scratch / "openhands-spec.json"
        spec = {"task": context.prompt, "container_id": context.container_id, "workdir": context.workdir,
                "api_base": context.openai_base_url, "model": MODEL_NAME, "max_iterations": context.max_turns,
                "scratch": str(context.scratch / "openhands"), "transcript": str(transcript),
                "user": context.sandbox_user}
        python = context.install_dir / "venv" / "bin" / "python"
        env = {
            "DOCKER_HOST": context.docker_host,
            "HOME": str(context.scratch / "openhands-home"),  # no user-level skills, plugins or settings
            "OPENHANDS_SUPPRESS_BANNER": "1",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch of litellm's cost map
            "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
        }
        return HarnessLaunch(
            command=(f"mkdir -p {shlex.quote(env['HOME'])} {shlex.quote(spec['scratch'])} && "
                     f"exec {shlex.quote(str(python))} {shlex.quote(str(RUNNER))} {shlex.quote(str(spec_path))}"),
            env=env, files={str(spec_path): json.dumps(spec).encode()}, transcripts=[str(transcript)])

    def termination(self, result: HarnessRunResult) -> TerminationReason:
        final = result_line(result.output)
        if "MaxIterationsReached" in final.get("errors", []):
            return TerminationReason.max_turns
        if final.get("status") in {"finished", "stuck"}:
            return TerminationReason.completed
        return TerminationReason.harness_crash

    def gold_replies(self, command: str) -> list[str]:
        return ["I will apply the fix.\n" + tool_call("terminal", {"command": command}),
                tool_call("finish", {"message": "The fix is applied."})]

    def actions(self, result: HarnessRunResult) -> list[str]:
        """The tool calls of its ActionEvents (terminal commands as themselves), in order."""
        found = []
        for text in result.transcripts.values():
            for event in json_lines(text):
                if event.get("kind") == "ActionEvent":
                    call = event.get("tool_call") or {}
                    found.append(action_of(event.get("tool_name") or call.get("name", ""),
                                           parse_arguments(call.get("arguments"))))
        return found
