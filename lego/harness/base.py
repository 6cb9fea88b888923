"""What a harness adapter is: a description of the harness, and how to launch it for one task.

An adapter never runs anything itself: it says how the harness is installed (once per machine, cached), where it
runs, and for one task which command, environment and files to use and how to read the way it ended. The rollout
(lego/rollout/) does the running, so every harness gets the same sandbox, timeouts, turn guard and cleanup.

Where a harness runs:
- `sandbox`: a CLI agent (a native binary from npm) runs inside the task's container, acting on its files; its
  install directory is mounted read-only at `MOUNT_POINT` (never installed per rollout). It reaches its proxy
  session through the in-container relay (the container has no network).
- `beside`: a Python agent runs on the host in its own cached venv and executes every command inside the
  container (`docker exec`, always as `HarnessContext.sandbox_user`, the agent); it reaches its proxy session on
  the host's loopback.
In the sandbox the harness runs as the unprivileged agent user (lego.sandbox.docker_sandbox.AGENT_UID, no
/etc/passwd entry) with HARNESS_HOME, a tmpfs it owns, as its home.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from lego.errors import LegoError
from lego.records import TerminationReason
from lego.sandbox.docker_sandbox import AGENT_HOME, AGENT_USER
from lego.tasksets.task import Task

WireProtocol = Literal["openai_chat", "anthropic_messages", "openai_responses"]
MOUNT_POINT = "/opt/lego/harness"  # where a sandbox harness's install directory appears in the container
HARNESS_HOME = AGENT_HOME  # the agent's writable home (a tmpfs it owns): harness state and transcripts live here
MODEL_NAME = "lego-policy"  # the model name harnesses are told to use (the proxy serves any name)
PROMPT_FILE = "/tmp/.lego-prompt.txt"  # where CLI harnesses in the sandbox read the task prompt from


class HarnessError(LegoError):
    """A harness is unknown, cannot be installed, or was misconfigured."""


@dataclass(frozen=True)
class HarnessSpec:
    """The facts about a harness that do not depend on the task."""

    name: str
    protocol: WireProtocol
    default_version: str
    install_kind: Literal["npm", "venv"]
    packages: tuple[str, ...]  # package specs; "{version}" is replaced by the pinned version
    runs: Literal["sandbox", "beside"]
    prompt_via: str  # how the task prompt reaches the harness (for humans and reports)
    ends_by: tuple[str, ...]  # what ends a run: "exit", "max_turns", "time_limit"
    transcript: str  # where the harness writes its own transcript
    python: str | None = None  # venv installs: the Python version the harness needs
    # Calls per run outside the main thread (title generation, a forced final summary): the turn guard allows them.
    side_calls: int = 0
    optional: bool = False  # slow or heavy to install: `lego setup` may leave it out
    # A `beside` harness's third-party modules a rollout worker imports once (lego.harness.forkserver): each rollout's
    # harness is then a fork that skips them. Only modules whose import reads nothing a rollout sets.
    preload: tuple[str, ...] = ()


class ForkserverCommand(Protocol):
    def command(self, script: Path, *args: str | Path) -> str:
        """The shell command that runs `script args...` in the harness venv's Python, as a fork of the server."""
        ...


# What every beside harness's environment has: litellm must not fetch its cost map, and the proxy session on the
# loopback must not go through a proxy. A forkserver preloads under it too.
BESIDE_ENV = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "NO_PROXY": "127.0.0.1,localhost",
              "no_proxy": "127.0.0.1,localhost"}


@dataclass
class HarnessContext:
    """Everything an adapter needs to launch the harness for one task."""

    task: Task
    prompt: str
    base_url: str  # the proxy session's base URL as the harness sees it (…/s/<id>, no /v1)
    install_dir: Path  # on the host
    runtime_dir: str  # the install as the harness sees it: MOUNT_POINT inside the sandbox, the host path beside it
    workdir: str  # the repository inside the sandbox
    max_turns: int
    timeout_s: float
    scratch: Path  # a host directory private to this rollout attempt (configs, transcripts of beside harnesses)
    container_id: str = ""
    docker_host: str = ""
    exec_timeout_s: float = 120.0
    sandbox_user: str = AGENT_USER  # "uid:gid" every command of a beside harness must run as in the container
    extra: dict = field(default_factory=dict)  # HarnessConfig.extra
    forkserver: ForkserverCommand | None = None  # the worker's (spec.preload); None: a cold start

    @property
    def openai_base_url(self) -> str:
        return f"{self.base_url}/v1"


@dataclass
class HarnessLaunch:
    """How the rollout starts the harness for one task."""

    command: str  # a bash command line (run in the sandbox's workdir, or on the host in the scratch dir)
    env: dict[str, str]
    files: dict[str, bytes] = field(default_factory=dict)  # written before start (sandbox paths, or host paths)
    transcripts: list[str] = field(default_factory=list)  # paths (sandbox or host) to keep as artifacts; globs ok


@dataclass
class HarnessRunResult:
    exit_code: int
    output: str  # stdout + stderr (capped)
    transcripts: dict[str, str]  # path -> text of each collected transcript
    metadata: dict = field(default_factory=dict)  # max_turns, main_calls: what the rollout knows about the run


@runtime_checkable
class HarnessAdapter(Protocol):
    spec: HarnessSpec

    def launch(self, context: HarnessContext) -> HarnessLaunch:
        """The command, environment and files that run the harness on `context.task`."""
        ...

    def termination(self, result: HarnessRunResult) -> TerminationReason:
        """How the run ended, from the harness's own output: completed, max_turns or harness_crash (the rollout
        then attributes a crash with controls: the policy's stays harness_crash, infra becomes harness_failed)."""
        ...

    def gold_replies(self, command: str) -> list[str]:
        """The model's replies, in order, that run the shell `command` with this harness's own tool and then finish
        its own way: a scripted policy that solves a task with its gold patch (see `apply_patch_command`), for warm
        starts and benchmarks. Side calls the harness makes (a title request) get a reply of their own."""
        ...


def tool_call(name: str, arguments: dict) -> str:
    """A tool call as the Qwen3 chat template has the model write it; the proxy turns it into the protocol's."""
    import json

    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def fix_reply(tool: str, arguments: dict) -> str:
    """The gold reply that applies the fix with the harness's shell `tool`."""
    return "I will apply the fix.\n" + tool_call(tool, arguments)


GOLD_PATCH_FILE = "/tmp/lego-gold.patch"


def apply_patch_command(patch: str) -> str:
    """One shell command that applies `patch` in the repository, whatever it changes."""
    return (f"cat > {GOLD_PATCH_FILE} <<'LEGO_GOLD_EOF'\n{patch}LEGO_GOLD_EOF\n"
            f"git apply {GOLD_PATCH_FILE} && rm {GOLD_PATCH_FILE} && git status --short")


_HUNK = re.compile(r"@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@")


def line_edit_command(patch: str) -> str | None:
    """`sed -i` edits by line number that make `patch`'s change: only the lines it writes, not its context, so a
    demonstration of it is a third of `apply_patch_command`'s tokens (what a warm start fits, and what a rollout
    samples). None when the patch does more than edit lines of existing text files (a new, deleted or renamed file,
    a binary, a missing final newline): `apply_patch_command` does that."""
    if "\\ No newline" in patch or "\nGIT binary patch" in patch:
        return None
    edits: dict[str, list[str]] = {}
    path, old_line, block = None, 0, None  # block: [first old line, lines removed, lines added]

    def close_block() -> None:
        nonlocal block
        if block is not None and path is not None:
            edits[path].append(_sed_edit(*block))
        block = None

    for line in patch.splitlines():
        if line.startswith("diff --git "):
            close_block()
            path = None
        elif line.startswith(("new file", "deleted file", "rename ", "copy ", "old mode", "new mode", "Binary")):
            return None
        elif line.startswith("--- "):
            close_block()
        elif line.startswith("+++ "):
            if not line.startswith("+++ b/"):
                return None
            path = line[len("+++ b/"):]
            edits.setdefault(path, [])
        elif line.startswith("@@"):
            close_block()
            match = _HUNK.match(line)
            if match is None or path is None:
                return None
            old_line = int(match.group(1)) if match.group(2) != "0" else int(match.group(1)) + 1
        elif path is None or line.startswith("index "):
            continue
        elif line.startswith("-"):
            block = block or [old_line, 0, []]
            block[1] += 1
            old_line += 1
        elif line.startswith("+"):
            block = block or [old_line, 0, []]
            block[2].append(line[1:])
        else:  # context
            close_block()
            old_line += 1
    close_block()
    if not edits or not all(edits.values()):
        return None
    return " && ".join("sed -i " + " ".join(f"-e {_shell_quote(edit)}" for edit in file_edits) + f" {_shell_quote(p)}"
                       for p, file_edits in edits.items())


def _sed_edit(first: int, removed: int, added: list[str]) -> str:
    """One sed command: lines first..first+removed-1 changed to `added`, or deleted; or `added` inserted before
    line `first`, that is after line first-1, which also holds where `first` is past the file's end (all numbers
    are the original file's: one sed pass reads them before any edit)."""
    if not added:
        return f"{first},{first + removed - 1}d"
    text = "\\\n".join(line.replace("\\", "\\\\") for line in added)
    if removed:
        return f"{first},{first + removed - 1}c\\\n{text}"
    return f"{first - 1}a\\\n{text}" if first > 1 else f"1i\\\n{text}"


def _shell_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


# The harnesses: name -> "module:class" of its adapter. The module is imported on first use, so that a harness's
# module loads only when it is named; the adapter's spec.name must be its name here.
HARNESSES = {
    "mini-swe-agent": "lego.harness.mini_swe_agent:MiniSweAgent",
    "claude-code": "lego.harness.claude_code:ClaudeCode",
    "opencode": "lego.harness.opencode:OpenCode",
    "codex": "lego.harness.codex:Codex",
    "openhands": "lego.harness.openhands:OpenHands",
}


def harness_names() -> list[str]:
    return sorted(HARNESSES)


def get_harness(name: str) -> HarnessAdapter:
    import importlib

    if name not in HARNESSES:
        raise HarnessError(f"unknown harness {name!r}; choose one of {', '.join(harness_names())} "
                           "(harness.name in the config)")
    module, _, cls = HARNESSES[name].partition(":")
    adapter = getattr(importlib.import_module(module), cls)()
    if adapter.spec.name != name:
        raise HarnessError(f"{HARNESSES[name]} describes harness {adapter.spec.name!r}, not {name!r}")
    return adapter


def resolve_version(adapter: HarnessAdapter, version: str | None) -> str:
    return version or adapter.spec.default_version


def default_prompt(task: Task) -> str:
    """The task as every harness receives it: the issue text, and where the repository is."""
    return (f"{task.problem_statement.strip()}\n\nThe repository is in the current directory. "
            "Change its source files to resolve the issue above.")


def locate(context: HarnessContext, *candidates: str) -> str:
    """The first of `candidates` (paths relative to the install dir) that exists, as the harness sees it."""
    for relative in candidates:
        if (context.install_dir / relative).exists():
            return f"{context.runtime_dir}/{relative}"
    raise HarnessError(f"none of {', '.join(candidates)} is under {context.install_dir}; the install is "
                       f"incomplete: delete that directory and run `lego setup` again")


def sandbox_launch(context: HarnessContext, command: str, env: dict[str, str], transcripts: list[str],
                   files: dict[str, bytes] | None = None) -> HarnessLaunch:
    """How a CLI harness starts inside the sandbox: the agent's home as HOME, the task prompt in PROMPT_FILE."""
    return HarnessLaunch(command=command, env={"HOME": HARNESS_HOME, **env},
                         files={PROMPT_FILE: context.prompt.encode(), **(files or {})}, transcripts=transcripts)


def beside_launch(context: HarnessContext, runner: Path, name: str, settings: dict, env: dict[str, str],
                  transcript: Path, make_dirs: tuple[str, ...] = ()) -> HarnessLaunch:
    """How a Python harness starts beside the sandbox: its `runner`, in the install's venv, reads a JSON spec
    naming the task, the container (acted on as the sandbox user) and the proxy session, with its own `settings`;
    forked from the worker's forkserver when there is one."""
    import json
    import shlex

    spec_path = context.scratch / f"{name}-spec.json"
    spec = {"task": context.prompt, "container_id": context.container_id, "workdir": context.workdir,
            "api_base": context.openai_base_url, "model": MODEL_NAME, "user": context.sandbox_user, **settings}
    env = {"DOCKER_HOST": context.docker_host, **env, **BESIDE_ENV}
    if context.forkserver is not None:
        command = context.forkserver.command(runner, spec_path)
    else:
        python = context.install_dir / "venv" / "bin" / "python"
        command = "exec " + " ".join(shlex.quote(str(part)) for part in (python, runner, spec_path))
    if make_dirs:
        command = f"mkdir -p {' '.join(shlex.quote(path) for path in make_dirs)} && {command}"
    return HarnessLaunch(command=command, env=env, files={str(spec_path): json.dumps(spec).encode()},
                         transcripts=[str(transcript)])


def last_json_line(output: str, predicate: Callable[[dict], bool] = lambda _: True) -> dict:
    """The last line of `output` that is a JSON object satisfying `predicate` ({} when none)."""
    return next((value for value in reversed(json_lines(output)) if predicate(value)), {})


SHELL_TOOLS = {"bash", "Bash", "terminal", "execute_bash", "exec_command", "shell"}


def action_of(tool: str, arguments) -> str:
    """One action as the verifier scans it: a shell command as itself, any other tool call as
    `tool {json arguments}` (so that paths read and contents written are visible too)."""
    import json

    if not isinstance(arguments, dict):
        arguments = {"arguments": arguments}
    command = arguments.get("command", arguments.get("cmd"))
    if tool in SHELL_TOOLS and isinstance(command, str):
        return command
    if tool in SHELL_TOOLS and isinstance(command, list):
        return " ".join(str(part) for part in command)
    return f"{tool} {json.dumps(arguments, ensure_ascii=False, sort_keys=True)}"


def json_lines(text: str) -> list[dict]:
    """The JSON objects among the lines of `text` (other lines skipped)."""
    import json

    found = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                found.append(value)
    return found


def parse_arguments(raw) -> dict:
    """Tool-call arguments as sent (a JSON string) or already parsed."""
    import json

    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw or "{}")
    except (TypeError, ValueError):
        return {"arguments": raw}
    return value if isinstance(value, dict) else {"arguments": value}
