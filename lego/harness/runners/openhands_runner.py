"""Runs the OpenHands V1 agent (openhands-sdk + openhands-tools) beside a Lego sandbox, by the SDK venv's Python.

Usage: python openhands_runner.py SPEC.json
SPEC: {"task", "container_id", "workdir", "api_base", "model", "max_iterations", "scratch", "transcript", "user"}.
Every Docker exec names the spec's unprivileged `user` (without it, it would run as the container's own user).

The agent is the SDK's default CLI agent (`get_default_agent(llm, cli_mode=True)`: terminal, file_editor,
task_tracker, finish, think; native tool calling over OpenAI chat completions to the proxy session). The only
change is where its two host-acting tools act, made through the SDK's tool registry (a registered ToolDefinition
subclass per tool name, so the model sees the same names, schemas and descriptions):
- terminal: the SDK's own TerminalExecutor and PTY session, whose shell is docker_shell.py, a `bash -i` on a TTY
  inside the container: the persistent session, PS1 metadata, timeouts and Ctrl-C all work as on a local machine.
- file_editor: the SDK's own FileEditor over a host mirror of the paths it touches: before each call the path is
  copied out of the container (a directory as its 2-level listing), after a write it is copied back, and mirror
  paths in the observation are turned back into container paths. Edits land in the container's files.
The conversation's host working dir is the mirror of the container's workdir; the model is shown the container's.
Events are appended to the transcript as JSON lines. Prints one line `LEGO_RESULT {json}`.
"""

import base64
import json
import os
import posixpath
import shlex
import shutil
import stat
import sys
from pathlib import Path, PurePosixPath
from types import SimpleNamespace

import docker
from openhands.sdk import LLM, Conversation
from openhands.sdk.conversation.state import ConversationExecutionStatus
from openhands.sdk.event.conversation_error import ConversationErrorEvent
from openhands.sdk.tool import ToolExecutor, register_tool
from openhands.tools.file_editor import FileEditorTool
from openhands.tools.file_editor.impl import FileEditorExecutor
from openhands.tools.preset.default import get_default_agent
from openhands.tools.terminal import TerminalTool
from openhands.tools.terminal.impl import TerminalExecutor
from pydantic import SecretStr
from sandbox_exec import exec_stream

SHELL = Path(__file__).parent / "docker_shell.py"
WRITES = {"create", "str_replace", "insert", "undo_edit"}
SANDBOX: dict = {}  # container_id, workdir, scratch, api, user: set by main() before the tools are created


def _exec(api, container: str, script: str, *args: str) -> tuple[int, str]:
    exec_id = api.exec_create(container, ["bash", "-c", script, "lego", *args], user=SANDBOX["user"])["Id"]
    output = exec_stream.run_exec(api, exec_id).decode("utf-8", errors="replace")
    return api.exec_inspect(exec_id).get("ExitCode") or 0, output


class MirroredFileEditor(ToolExecutor):
    """The SDK's file editor acting on container files through a host mirror (see the module doc)."""

    # What is at a path: a directory's 2-level listing, or a file's mode and base64 content (the repo is on a
    # tmpfs, which the Docker archive API does not see), and whether its parent directory exists.
    PROBE = ('p="$1"; if [ -d "$p" ]; then echo dir; find "$p" -mindepth 1 -maxdepth 2 -printf "%y %P\\n"; '
             'elif [ -f "$p" ]; then echo "file $(stat -c %a "$p")"; base64 -w0 "$p"; echo; '
             'elif [ -e "$p" ]; then echo other; else echo none; fi; [ -d "$(dirname "$p")" ] && echo parent-ok')
    CHUNK = 96_000  # base64 characters per exec argument (a multiple of 4)

    def __init__(self, api, container: str, workdir: str, mirror: Path):
        self.api, self.container, self.workdir, self.mirror = api, container, workdir, mirror
        self.inner = FileEditorExecutor(workspace_root=self.local(workdir))

    def local(self, path: str) -> str:
        # Normalized first: "/repo/../../../etc/x" is the container's /etc/x, and its mirror stays inside the
        # mirror directory (the model's path must never name a file on the host).
        return str(self.mirror) + posixpath.normpath("/" + path.lstrip("/"))

    def __call__(self, action, conversation=None):
        path = posixpath.normpath(action.path) if action.path.startswith("/") else action.path
        if path != action.path:
            action = action.model_copy(update={"path": path})
        remote = path if path.startswith("/") else str(PurePosixPath(self.workdir) / path)
        self.pull(remote)
        if not path.startswith("/"):  # the editor refuses it and suggests the absolute path (mapped back below)
            return self.unmirror(self.inner(action, conversation))
        observation = self.inner(action.model_copy(update={"path": self.local(path)}), conversation)
        if action.command in WRITES and not observation.is_error:
            self.push(path)
        return self.unmirror(observation)

    def pull(self, remote: str) -> None:
        local = Path(self.local(remote))
        code, output = _exec(self.api, self.container, self.PROBE, remote)
        lines = output.splitlines()
        kind = lines[0] if lines else "none"
        if local.is_dir() and not local.is_symlink():
            shutil.rmtree(local)
        elif local.exists() or local.is_symlink():
            local.unlink()
        if "parent-ok" in lines:
            local.parent.mkdir(parents=True, exist_ok=True)
        if kind == "dir":
            local.mkdir(parents=True, exist_ok=True)
            for line in lines[1:]:
                if line == "parent-ok" or len(line) < 3:
                    continue
                relative = PurePosixPath(line[2:])
                # A file name may hold a newline, and so forge a listing line: nothing outside `local` is made.
                if relative.is_absolute() or ".." in relative.parts:
                    continue
                entry = local / relative
                if line[0] == "d":
                    entry.mkdir(parents=True, exist_ok=True)
                else:
                    entry.parent.mkdir(parents=True, exist_ok=True)
                    entry.touch()
        elif kind.startswith("file"):
            local.write_bytes(base64.b64decode(lines[1]) if len(lines) > 1 and lines[1] != "parent-ok" else b"")
            local.chmod(int(kind.split()[1], 8) if len(kind.split()) > 1 else 0o644)

    def push(self, remote: str) -> None:
        local = Path(self.local(remote))
        encoded = base64.b64encode(local.read_bytes()).decode()
        for start in range(0, max(len(encoded), 1), self.CHUNK):
            redirect = ">" if start == 0 else ">>"
            code, output = _exec(self.api, self.container, f'printf %s "$2" | base64 -d {redirect} "$1"',
                                 remote, encoded[start:start + self.CHUNK])
            if code != 0:
                raise OSError(f"writing {remote} in the sandbox failed: {output[-300:]}")
        _exec(self.api, self.container, 'chmod "$2" "$1"', remote, f"{stat.S_IMODE(local.stat().st_mode):o}")

    def unmirror(self, observation):
        prefix = str(self.mirror)

        def fix(value):
            if isinstance(value, str):
                return value.replace(prefix, "")
            if isinstance(value, list):
                return [fix(item) for item in value]
            if hasattr(value, "text") and isinstance(value.text, str):
                return value.model_copy(update={"text": fix(value.text)})
            return value

        updates = {name: fix(getattr(observation, name)) for name in ("path", "content")
                   if getattr(observation, name, None) is not None}
        return observation.model_copy(update=updates)


class SandboxTerminalTool(TerminalTool):
    """`terminal`, with the SDK's PTY session on a shell inside the sandbox container."""

    name = TerminalTool.name

    @classmethod
    def create(cls, conv_state, **params):
        host_dir = str(SANDBOX["scratch"] / "terminal")
        os.makedirs(host_dir, exist_ok=True)
        shell = SANDBOX["scratch"] / "container-shell"
        shell.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(SHELL))} "
                         f"{shlex.quote(SANDBOX['container_id'])} {shlex.quote(SANDBOX['workdir'])} "
                         f"{shlex.quote(SANDBOX['user'])}\n")
        shell.chmod(0o755)
        executor = TerminalExecutor(working_dir=host_dir, terminal_type="subprocess", shell_path=str(shell),
                                    full_output_save_dir=conv_state.env_observation_persistence_dir)
        # TerminalTool.create only checks that its working dir exists on this host: give it the host one.
        return TerminalTool.create(SimpleNamespace(workspace=SimpleNamespace(working_dir=host_dir)),
                                   executor=executor, **params)


class SandboxFileEditorTool(FileEditorTool):
    """`file_editor`, described with the container's workdir, acting on the container's files."""

    name = FileEditorTool.name

    @classmethod
    def create(cls, conv_state, **params):
        view = SimpleNamespace(workspace=SimpleNamespace(working_dir=SANDBOX["workdir"]), agent=conv_state.agent)
        executor = MirroredFileEditor(SANDBOX["api"], SANDBOX["container_id"], SANDBOX["workdir"],
                                      SANDBOX["scratch"] / "mirror")
        return [tool.set_executor(executor) for tool in FileEditorTool.create(view, **params)]


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text())
    scratch = Path(spec["scratch"])
    SANDBOX.update(container_id=spec["container_id"], workdir=spec["workdir"], scratch=scratch, user=spec["user"],
                   api=docker.from_env(timeout=600).api)
    llm = LLM(model=f"openai/{spec['model']}", base_url=spec["api_base"], api_key=SecretStr("lego"),
              usage_id="agent")
    agent = get_default_agent(llm, cli_mode=True)
    register_tool(TerminalTool.name, SandboxTerminalTool)
    register_tool(FileEditorTool.name, SandboxFileEditorTool)
    host_workdir = scratch / "mirror" / spec["workdir"].lstrip("/")
    host_workdir.mkdir(parents=True, exist_ok=True)
    transcript = open(spec["transcript"], "a", encoding="utf-8")
    errors: list[str] = []

    def record(event) -> None:
        if isinstance(event, ConversationErrorEvent):
            errors.append(event.code)
        transcript.write(event.model_dump_json() + "\n")
        transcript.flush()

    conversation = Conversation(agent=agent, workspace=str(host_workdir), callbacks=[record],
                                max_iteration_per_run=int(spec["max_iterations"]), visualizer=None,
                                persistence_dir=str(scratch / "state"))
    result: dict = {}
    try:
        conversation.send_message(spec["task"])
        conversation.run()
    except Exception as exc:  # the events so far are in the transcript; report the crash
        result = {"status": "crashed", "error_type": type(exc).__name__, "error": str(exc)[-2000:]}
    finally:
        status = conversation.state.execution_status
        result = {"status": status.value if isinstance(status, ConversationExecutionStatus) else str(status),
                  "errors": errors, **result}
        conversation.close()
        transcript.close()
    print("LEGO_RESULT " + json.dumps(result), flush=True)
    return 0 if result["status"] == "finished" else 1


if __name__ == "__main__":
    sys.exit(main())
