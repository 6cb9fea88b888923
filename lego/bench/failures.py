"""What a policy's failed attempts at family tasks got right.

A family task's fix is one command built from three parts of its statement (lego.tasksets.family.gold_command):
the function, the return line (`body`) and the file's path. Each failed attempt's first reply is read for which of
them it wrote, so an evaluation's failures split into "all three" (the command was right but did not run: a tool
call that did not parse), "function and body, not the path", "none of them" and the rest. It says which part a
policy fails to copy from the statement, the thing to practise next.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from lego.config import LegoConfig
from lego.data.catalog import Catalog
from lego.workdir import WorkDir

# lego.tasksets.family.gold_command's shape: sed -i '/def FUNCTION/,/^$/s/retu.*/BODY/' PATH && git diff
GOLD_COMMAND = re.compile(r"^sed -i '/def (?P<function>\w+)/,/\^\$/s/retu\.\*/(?P<body>.*)/' (?P<path>\S+) && git diff$")
LABELS = ("all three", "function and body, not the path", "function only", "none of them", "other")


def command_parts(gold_command: str) -> dict[str, str] | None:
    """The function, body and path of a family task's command; None for any other command."""
    found = GOLD_COMMAND.match(gold_command.strip())
    return found.groupdict() if found else None


def reply_text(reply_json: str) -> str:
    """A recorded reply's text and its tool calls' arguments (a parsed tool call holds the command there)."""
    try:
        reply = json.loads(reply_json)
    except (TypeError, ValueError):
        return reply_json or ""
    messages = [choice.get("message") or {} for choice in reply.get("choices", [])] if "choices" in reply else [reply]
    parts: list[str] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):  # Anthropic's blocks: text, and tool_use with its input
            parts += [block.get("text") or json.dumps(block.get("input", "")) for block in content
                      if isinstance(block, dict)]
        for call in message.get("tool_calls") or []:
            arguments = (call.get("function") or {}).get("arguments", "")
            try:
                arguments = json.loads(arguments).get("command", arguments)
            except (TypeError, ValueError, AttributeError):
                pass
            parts.append(str(arguments))
    return "\n".join(parts)


def label(text: str, parts: dict[str, str]) -> str:
    """Which of the command's parts `text` wrote."""
    function = f"def {parts['function']}" in text
    body = parts["body"] in text
    path = parts["path"] in text
    if function and body and path:
        return "all three"
    if function and body:
        return "function and body, not the path"
    if function and not path:
        return "function only"
    if not (function or body or path):
        return "none of them"
    return "other"


def failure_parts(work_dir: str | Path, config: LegoConfig, data_run_id: str) -> dict[str, Any] | None:
    """For one evaluation (its `data_run_id`): its resolved attempts and its failures by `label` of their first
    reply. None where its tasks are not a family's (no command of that shape) or nothing is stored."""
    with Catalog.open(WorkDir.create(work_dir), config, in_memory=True) as catalog:
        rows = catalog.rows(
            "SELECT r.rollout_id, r.task_id, o.kind, c.reply_json FROM rollouts r "
            "JOIN latest_outcomes o ON o.run_id = r.run_id AND o.rollout_id = r.rollout_id "
            "LEFT JOIN llm_calls c ON c.run_id = r.run_id AND c.rollout_id = r.rollout_id AND c.call_index = 0 "
            "WHERE r.run_id = ?", [data_run_id])
        tasks = {row["instance_id"]: row["task_json"] for row in catalog.rows(
            "SELECT DISTINCT instance_id, task_json FROM tasks WHERE instance_id IN "
            "(SELECT task_id FROM rollouts WHERE run_id = ?)", [data_run_id])}
    commands = {}
    for task, task_json in tasks.items():
        provenance = (json.loads(task_json or "{}") or {}).get("provenance") or {}
        commands[task] = command_parts(provenance.get("gold_command") or "")
    if not rows or not all(commands.get(row["task_id"]) for row in rows):
        return None
    counts = {"resolved": 0, **{name: 0 for name in LABELS}, "infra_error": 0}
    for row in rows:
        if row["kind"] in ("resolved", "infra_error"):
            counts[row["kind"]] += 1
        else:
            counts[label(reply_text(row["reply_json"] or ""), commands[row["task_id"]])] += 1
    return counts
