"""Claude Code (npm `@anthropic-ai/claude-code`), inside the sandbox.

The native binary from npm's platform package runs in the container from the read-only mount, in print mode:
`claude -p PROMPT --output-format json --max-turns N`, as the sandbox's unprivileged agent user (as root it would
need IS_SANDBOX=1 for --dangerously-skip-permissions, otherwise Bash is denied; it is set all the same);
CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 removes every call but the model's (no telemetry, no title request). It speaks Anthropic Messages (always streaming) to
ANTHROPIC_BASE_URL = the relay + the session path. The result is one JSON object on stdout (`subtype`: success,
error_max_turns, ...); the transcript is the session JSONL under $HOME/.claude/projects/.
The default version is what npm picks on Node 20 (2.1.197: later releases declare node >= 22).
"""

from __future__ import annotations

from lego.harness import base
from lego.harness.base import HARNESS_HOME, MODEL_NAME, PROMPT_FILE
from lego.records import TerminationReason


class ClaudeCode:
    spec = base.HarnessSpec(
        name="claude-code", protocol="anthropic_messages", default_version="2.1.197", install_kind="npm",
        packages=("@anthropic-ai/claude-code@{version}",), runs="sandbox",
        prompt_via=f"`-p` argument read from {PROMPT_FILE}",
        ends_by=("exit", "max_turns", "time_limit"),
        transcript=f"{HARNESS_HOME}/.claude/projects/<cwd>/<session>.jsonl",
    )

    def launch(self, context: base.HarnessContext) -> base.HarnessLaunch:
        binary = base.locate(context, "node_modules/@anthropic-ai/claude-code-linux-x64/claude",
                             "node_modules/@anthropic-ai/claude-code/bin/claude.exe")
        command = (f'exec {binary} -p "$(cat {PROMPT_FILE})" --output-format json --max-turns {context.max_turns} '
                   f"--dangerously-skip-permissions --model {MODEL_NAME} < /dev/null")
        env = {
            "IS_SANDBOX": "1",  # it is in a sandbox (needed by root for --dangerously-skip-permissions)
            "ANTHROPIC_BASE_URL": context.base_url,
            "ANTHROPIC_API_KEY": "lego",
            "ANTHROPIC_MODEL": MODEL_NAME,
            "ANTHROPIC_SMALL_FAST_MODEL": MODEL_NAME,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
        }
        return base.sandbox_launch(context, command, env, transcripts=[f"{HARNESS_HOME}/.claude/projects/*/*.jsonl"])

    def termination(self, result: base.HarnessRunResult) -> TerminationReason:
        final = base.last_json_line(result.output, lambda value: value.get("type") == "result")
        subtype = final.get("subtype")
        if subtype == "error_max_turns":
            return TerminationReason.max_turns
        if subtype == "success" and result.exit_code == 0:
            return TerminationReason.completed
        return TerminationReason.harness_crash

    def gold_replies(self, command: str) -> list[str]:
        return [base.fix_reply("Bash", {"command": command, "description": "Apply the fix"}), "The fix is applied."]

    def actions(self, result: base.HarnessRunResult) -> list[str]:
        """The tool_use inputs of the session transcript's assistant entries (Bash as its command), in order."""
        found, seen = [], set()
        for text in result.transcripts.values():
            for entry in base.json_lines(text):
                message = entry.get("message") if entry.get("type") == "assistant" else None
                content = message.get("content") if isinstance(message, dict) else None
                for block in content if isinstance(content, list) else []:
                    if isinstance(block, dict) and block.get("type") == "tool_use" and block.get("id") not in seen:
                        seen.add(block.get("id"))
                        found.append(base.action_of(block.get("name", ""), block.get("input") or {}))
        return found
