"""OpenCode (npm `opencode-ai`), inside the sandbox.

`opencode run --format json --auto` with the provider in the global config ($HOME/.config/opencode/opencode.json,
never in the repository, where it would show in the diff): an `@ai-sdk/openai-compatible` provider (bundled, no
runtime npm install) whose baseURL is the relay + the session's /v1. It streams OpenAI chat completions and makes
one title request per run (a side call, kept apart by the proxy as a sub-agent thread). `agent.build.steps` =
max_turns: at the limit OpenCode forces a text-only final answer.
Prompt quirk: `opencode run` wraps each positional argument that contains a space in literal double quotes, so
the prompt is passed as space-free words (split on spaces; newlines kept) after `--`; runs of spaces collapse.
The flags below keep it off the network (models.dev fetch, autoupdate, plugins, LSP downloads, sharing).
Output: JSONL events (step_start, text, tool_use, step_finish with reason tool-calls | stop), kept as the log.
"""

from __future__ import annotations

import json

from lego.harness import base
from lego.harness.base import HARNESS_HOME, MODEL_NAME, PROMPT_FILE
from lego.records import TerminationReason

CONFIG_FILE = f"{HARNESS_HOME}/.config/opencode/opencode.json"


def events(output: str) -> list[dict]:
    """The typed JSON events a `--format json` / `--json` run printed."""
    return [event for event in base.json_lines(output) if "type" in event]


class OpenCode:
    spec = base.HarnessSpec(
        name="opencode", protocol="openai_chat", default_version="1.18.33", install_kind="npm",
        packages=("opencode-ai@{version}",), runs="sandbox",
        prompt_via=f"positional words after `--`, read from {PROMPT_FILE} (see the quoting quirk)",
        ends_by=("exit", "max_turns", "time_limit"),
        transcript=f"stdout JSONL events; {HARNESS_HOME}/.local/share/opencode/log/*.log",
        side_calls=2,  # the title request, and the forced text-only answer at the step limit
    )

    def config(self, context: base.HarnessContext) -> dict:
        return {
            "$schema": "https://opencode.ai/config.json",
            "provider": {"lego": {"npm": "@ai-sdk/openai-compatible", "name": "Lego",
                                  "options": {"baseURL": context.openai_base_url, "apiKey": "lego"},
                                  "models": {MODEL_NAME: {"name": "Lego policy", "tool_call": True}}}},
            "model": f"lego/{MODEL_NAME}",
            "small_model": f"lego/{MODEL_NAME}",
            "autoupdate": False,
            "share": "disabled",
            "agent": {"build": {"steps": context.max_turns}},
        }

    def launch(self, context: base.HarnessContext) -> base.HarnessLaunch:
        binary = base.locate(context, "node_modules/opencode-linux-x64/bin/opencode",
                             "node_modules/opencode-linux-x64-baseline/bin/opencode")
        command = f"exec {binary} run --format json --auto < {PROMPT_FILE}"
        env = {
            "OPENCODE_CONFIG": CONFIG_FILE,
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_SHARE": "1",
        }
        files = {CONFIG_FILE: json.dumps(self.config(context)).encode()}
        return base.sandbox_launch(context, command, env, files=files,
                                   transcripts=[f"{HARNESS_HOME}/.local/share/opencode/log/*.log"])

    def termination(self, result: base.HarnessRunResult) -> TerminationReason:
        if result.exit_code != 0:
            return TerminationReason.harness_crash
        seen = events(result.output)
        if any(event["type"] == "error" for event in seen):
            return TerminationReason.harness_crash
        steps = sum(1 for event in seen if event["type"] == "step_start")
        max_turns = int(result.metadata.get("max_turns", 0))
        if max_turns and steps >= max_turns:
            return TerminationReason.max_turns
        return TerminationReason.completed

    def gold_replies(self, command: str) -> list[str]:
        # The first call is OpenCode's title request (a side call): it gets a title.
        return ["Title", base.fix_reply("bash", {"command": command, "description": "Apply the fix"}),
                "The fix is applied."]

    def actions(self, result: base.HarnessRunResult) -> list[str]:
        """The inputs of its `tool_use` events on stdout (bash as its command), in order."""
        found = []
        for event in events(result.output):
            part = event.get("part") if event["type"] == "tool_use" else None
            if isinstance(part, dict):
                state = part.get("state") or {}
                found.append(base.action_of(part.get("tool", ""), state.get("input") or {}))
        return found
