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

from pathlib import Path

from lego.harness import base
from lego.harness.mini_swe_agent import result_line
from lego.records import TerminationReason

RUNNER = Path(__file__).parent / "runners" / "openhands_runner.py"
# Run, not imported (lego.pipeline.keys); the runners read exec streams with lego/sandbox/exec_stream.py.
RUNTIME_FILES = (RUNNER, RUNNER.parent / "docker_shell.py", RUNNER.parent / "sandbox_exec.py",
                 RUNNER.parent.parent.parent / "sandbox" / "exec_stream.py")
class OpenHands:
    spec = base.HarnessSpec(
        name="openhands", protocol="openai_chat", default_version="1.58.2", install_kind="venv",
        packages=("openhands-sdk=={version}", "openhands-tools=={version}", "docker>=7.1"), python="3.12",
        runs="beside", prompt_via="the task text in a JSON spec file, sent as the conversation's first message",
        ends_by=("exit", "max_turns", "time_limit"),
        transcript="the conversation's events as JSON lines in the rollout's host scratch dir",
        optional=True,  # a 500 MB venv on Python 3.12, which not every machine has
        # 2.8 of the 4.8 s of CPU its imports take. Not the SDK itself: it is imported under the rollout's own HOME.
        preload=("litellm", "docker"),
    )

    def launch(self, context: base.HarnessContext) -> base.HarnessLaunch:
        transcript = context.scratch / "openhands.events.jsonl"
        settings = {"max_iterations": context.max_turns, "scratch": str(context.scratch / "openhands"),
                    "transcript": str(transcript)}
        env = {
            "HOME": str(context.scratch / "openhands-home"),  # no user-level skills, plugins or settings
            "OPENHANDS_SUPPRESS_BANNER": "1",
        }
        return base.beside_launch(context, RUNNER, "openhands", settings, env, transcript,
                                  make_dirs=(env["HOME"], settings["scratch"]))

    def termination(self, result: base.HarnessRunResult) -> TerminationReason:
        final = result_line(result.output)
        if "MaxIterationsReached" in final.get("errors", []):
            return TerminationReason.max_turns
        if final.get("status") in {"finished", "stuck"}:
            return TerminationReason.completed
        return TerminationReason.harness_crash

    def gold_replies(self, command: str) -> list[str]:
        return [base.fix_reply("terminal", {"command": command}),
                base.tool_call("finish", {"message": "The fix is applied."})]

    def actions(self, result: base.HarnessRunResult) -> list[str]:
        """The tool calls of its ActionEvents (terminal commands as themselves), in order."""
        found = []
        for text in result.transcripts.values():
            for event in base.json_lines(text):
                if event.get("kind") == "ActionEvent":
                    call = event.get("tool_call") or {}
                    found.append(base.action_of(event.get("tool_name") or call.get("name", ""),
                                                base.parse_arguments(call.get("arguments"))))
        return found
