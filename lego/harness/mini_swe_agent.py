"""mini-swe-agent (PyPI `mini-swe-agent`): its DefaultAgent and LiteLLM tool-call model, beside the sandbox.

A host venv cannot run inside the Debian container, so mini runs on the host in its own cached venv and executes
each command inside the sandbox container (runners/mini_swe_agent_runner.py: mini's DockerEnvironment pointed at
the existing container through the Docker API). Its model calls go to the proxy session on the host's loopback
(OpenAI chat completions, one `bash` tool). It ends when a command prints COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT
(exit status Submitted), at its step limit (LimitsExceeded; set to max_turns), or after 3 malformed replies in a
row (RepeatedFormatError: the agent's own ending, counted as completed). Its trajectory JSON is the transcript.
"""

from __future__ import annotations

import json
from pathlib import Path

from lego.harness import base
from lego.records import TerminationReason

RUNNER = Path(__file__).parent / "runners" / "mini_swe_agent_runner.py"
# Run, not imported (lego.pipeline.keys); the runner reads exec streams with lego/sandbox/exec_stream.py.
RUNTIME_FILES = (RUNNER, RUNNER.parent / "sandbox_exec.py", RUNNER.parent.parent.parent / "sandbox" / "exec_stream.py")
RESULT_PREFIX = "LEGO_RESULT "
COMPLETED = {"Submitted", "RepeatedFormatError"}


def result_line(output: str) -> dict:
    for line in reversed(output.splitlines()):
        if line.startswith(RESULT_PREFIX):
            try:
                return json.loads(line[len(RESULT_PREFIX):])
            except ValueError:
                return {}
    return {}


class MiniSweAgent:
    spec = base.HarnessSpec(
        name="mini-swe-agent", protocol="openai_chat", default_version="2.4.6", install_kind="venv",
        packages=("mini-swe-agent=={version}", "docker>=7.1"), python="3.11", runs="beside",
        prompt_via="the task text in a JSON spec file, passed to DefaultAgent.run(task)",
        ends_by=("exit", "max_turns", "time_limit"),
        transcript="mini's trajectory JSON (agent output_path) in the rollout's host scratch dir",
        preload=("litellm", "docker", "yaml"),  # LiteLLM: ~3 s of CPU per import; read env: BESIDE_ENV only
    )

    def launch(self, context: base.HarnessContext) -> base.HarnessLaunch:
        transcript = context.scratch / "mini.traj.json"
        settings = {"step_limit": context.max_turns, "exec_timeout_s": context.exec_timeout_s,
                    "output_path": str(transcript)}
        env = {
            "MSWEA_CONFIGURED": "true",  # otherwise mini starts its interactive first-run setup
            "MSWEA_COST_TRACKING": "ignore_errors",  # an unknown model name must not fail cost tracking
            "MSWEA_GLOBAL_CONFIG_DIR": str(context.scratch / "mini-config"),
        }
        return base.beside_launch(context, RUNNER, "mini", settings, env, transcript)

    def termination(self, result: base.HarnessRunResult) -> TerminationReason:
        status = result_line(result.output).get("exit_status")
        if status in COMPLETED:
            return TerminationReason.completed
        if status == "LimitsExceeded":
            return TerminationReason.max_turns
        return TerminationReason.harness_crash

    def gold_replies(self, command: str) -> list[str]:
        return [base.fix_reply("bash", {"command": command}),
                "Done; submitting.\n" + base.tool_call("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})]

    def actions(self, result: base.HarnessRunResult) -> list[str]:
        """The bash commands of the trajectory's assistant tool calls, in order."""
        found = []
        for text in result.transcripts.values():
            try:
                messages = json.loads(text).get("messages", [])
            except (ValueError, AttributeError):
                continue
            for message in messages:
                if not isinstance(message, dict) or message.get("role") != "assistant":
                    continue
                for call in message.get("tool_calls") or []:
                    function = call.get("function") or {}
                    found.append(base.action_of(function.get("name", ""), base.parse_arguments(function.get("arguments"))))
        return found
