"""Codex CLI (npm `@openai/codex`), inside the sandbox.

`codex exec --json --dangerously-bypass-approvals-and-sandbox` (the container is the sandbox) with
$CODEX_HOME/config.toml naming a provider whose base_url is the relay + the session's /v1. Codex speaks only the
OpenAI Responses API (`wire_api = "responses"`; "chat" is rejected). The analytics/feedback/otel/plugins/update
keys keep it off the network. It has no turn limit of its own: the rollout's turn guard stops it at max_turns.
It reads stdin when stdin is not a TTY, hence `< /dev/null`. Output: JSONL events (thread.started, item.*,
turn.completed | turn.failed); the session rollout JSONL under $CODEX_HOME/sessions is the transcript.
"""

from __future__ import annotations

from lego.harness import base
from lego.harness.base import HARNESS_HOME, MODEL_NAME, PROMPT_FILE
from lego.harness.opencode import events
from lego.records import TerminationReason

CODEX_HOME = f"{HARNESS_HOME}/.codex"


def config_toml(base_url: str) -> str:
    return f"""model = "{MODEL_NAME}"
model_provider = "lego"
check_for_update_on_startup = false

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"
metrics_exporter = "none"

[features]
plugins = false

[model_providers.lego]
name = "Lego"
base_url = "{base_url}"
env_key = "LEGO_API_KEY"
wire_api = "responses"
"""


class Codex:
    spec = base.HarnessSpec(
        name="codex", protocol="openai_responses", default_version="0.171.0", install_kind="npm",
        packages=("@openai/codex@{version}",), runs="sandbox",
        prompt_via=f"the positional prompt of `codex exec`, read from {PROMPT_FILE}",
        ends_by=("exit", "time_limit"),
        transcript=f"stdout JSONL events; {CODEX_HOME}/sessions/**/rollout-*.jsonl",
    )

    def launch(self, context: base.HarnessContext) -> base.HarnessLaunch:
        vendor = "node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl"
        binary = base.locate(context, f"{vendor}/bin/codex", f"{vendor}/codex/codex")
        command = (f'exec {binary} exec --json --dangerously-bypass-approvals-and-sandbox --skip-git-repo-check '
                   f'-C {context.workdir} "$(cat {PROMPT_FILE})" < /dev/null')
        env = {"CODEX_HOME": CODEX_HOME, "LEGO_API_KEY": "lego"}
        files = {f"{CODEX_HOME}/config.toml": config_toml(context.openai_base_url).encode()}
        return base.sandbox_launch(context, command, env, files=files,
                                   transcripts=[f"{CODEX_HOME}/sessions/*/*/*/rollout-*.jsonl"])

    def termination(self, result: base.HarnessRunResult) -> TerminationReason:
        kinds = [event["type"] for event in events(result.output)]
        if result.exit_code == 0 and "turn.completed" in kinds:
            return TerminationReason.completed
        return TerminationReason.harness_crash

    def gold_replies(self, command: str) -> list[str]:
        return [base.fix_reply("exec_command", {"cmd": command}), "The fix is applied."]

    def actions(self, result: base.HarnessRunResult) -> list[str]:
        """Its `command_execution` items on stdout (once each, started or completed), and other tool items
        (file changes, MCP calls, web searches) as JSON, in order."""
        items: dict[str, dict] = {}
        for event in events(result.output):
            item = event.get("item")
            if event["type"] in {"item.started", "item.completed"} and isinstance(item, dict):
                items[str(item.get("id", len(items)))] = item
        found = []
        for item in items.values():
            kind = item.get("type")
            if kind == "command_execution" and isinstance(item.get("command"), str):
                found.append(item["command"])
            elif kind in {"file_change", "mcp_tool_call", "web_search"}:
                found.append(base.action_of(kind, {key: value for key, value in item.items() if key not in {"id", "type"}}))
        return found
