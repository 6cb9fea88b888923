"""The Claude Code plugin in plugins/lego: its manifest names every command, each command's frontmatter parses,
every `lego` command it runs exists (and is run with --json where it has one) and is allowed by the command's
`allowed-tools`; Claude Code's own validator accepts the folder when the harness is installed."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from lego import REPO_ROOT
from lego_cli import app

PLUGIN = REPO_ROOT / "plugins" / "lego"
COMMANDS = sorted((PLUGIN / "commands").glob("*.md"))
# a `lego SUB ...` invocation in a command's bash blocks, maybe started in the background with nohup
INVOCATION = re.compile(r"^\s*((?:nohup\s+)?lego\s+([a-z][a-z-]*)\b.*)$", re.MULTILINE)
BASH_BLOCK = re.compile(r"```bash\n(.*?)```", re.DOTALL)
ALLOWED = re.compile(r"Bash\(([^:)]+)(?::\*)?\)")


def frontmatter(path: Path) -> tuple[dict, str]:
    text = path.read_text()
    match = re.match(r"---\n(.*?)\n---\n(.*)", text, re.DOTALL)
    assert match, f"{path.name}: no YAML frontmatter between --- lines"
    meta = yaml.safe_load(match.group(1))
    assert isinstance(meta, dict), f"{path.name}: the frontmatter is not a mapping"
    return meta, match.group(2)


def test_the_manifest_names_every_command_and_skill():
    manifest = json.loads((PLUGIN / ".claude-plugin" / "plugin.json").read_text())
    assert re.fullmatch(r"[a-z][a-z0-9]*(-[a-z0-9]+)*", manifest["name"]) and manifest["description"]
    assert sorted(manifest["commands"]) == [f"./commands/{path.name}" for path in COMMANDS]
    assert {path.stem for path in COMMANDS} == {"doctor", "run", "status", "dashboard"}
    for skill in manifest["skills"]:
        assert skill.startswith("./") and (PLUGIN / skill / "SKILL.md").is_file(), skill


def test_the_skill_names_itself_and_says_when_to_use_it():
    for path in (PLUGIN / "skills").glob("*/SKILL.md"):
        meta, body = frontmatter(path)
        assert meta["name"] == path.parent.name and len(meta["description"]) > 50
        assert "lego status --json" in body and "lego doctor --json" in body


@pytest.mark.parametrize("path", COMMANDS, ids=[path.stem for path in COMMANDS])
def test_each_command_is_a_thin_wrapper_over_an_existing_lego_command(path: Path):
    meta, body = frontmatter(path)
    assert isinstance(meta["description"], str) and meta["description"]
    allowed = ALLOWED.findall(meta["allowed-tools"])
    invocations = [match for block in BASH_BLOCK.findall(body) for match in INVOCATION.findall(block)]
    assert invocations, f"{path.name} runs no lego command"
    runner = CliRunner()
    for line, sub in invocations:
        shown = runner.invoke(app, [sub, "--help"])
        assert shown.exit_code == 0, f"{path.name}: `lego {sub}` is not a command of the CLI: {shown.output}"
        if "--json" in shown.output:
            assert "--json" in line.split(), f"{path.name}: `lego {sub}` has --json; the plugin must use it"
        assert any(line.startswith(prefix) for prefix in allowed), \
            f"{path.name}: {line!r} is not allowed by its allowed-tools {allowed}"
    # each allowed lego pattern is one the command uses (no blanket permission)
    for prefix in allowed:
        if "lego" in prefix.split():
            assert any(line.startswith(prefix) for line, _ in invocations), f"{path.name}: unused {prefix!r}"


def test_doctor_json_is_what_the_commands_read(monkeypatch):
    from lego import doctor

    checks = [doctor.Check("python", True, "3.11.7"), doctor.Check("gpu", False, "none", "optional", required=False)]
    monkeypatch.setattr(doctor, "run_checks", lambda config, work: checks)
    ready = CliRunner().invoke(app, ["doctor", "--json", "-c", "test"])
    assert ready.exit_code == 0, ready.output
    report = json.loads(ready.stdout)
    from lego.config import load_config

    assert report["ok"] is True and Path(report["work_dir"]) == load_config("test").project.work_dir.resolve()
    assert report["checks"][1] == {"name": "gpu", "ok": False, "detail": "none", "fix": "optional",
                                   "required": False}
    checks.append(doctor.Check("docker engine + base image", False, "no engine", "lego docker up"))
    missing = CliRunner().invoke(app, ["doctor", "--json", "-c", "test"])
    assert missing.exit_code == 1 and json.loads(missing.stdout)["ok"] is False


def claude_binary() -> Path:
    """Claude Code's native binary, installed now if this machine lacks it (as a rollout would): an install error
    fails the test rather than skipping it."""
    from lego.harness import get_harness
    from lego.harness.install import ensure_installed

    root = ensure_installed(get_harness("claude-code"))
    for relative in ("node_modules/@anthropic-ai/claude-code-linux-x64/claude",
                     "node_modules/@anthropic-ai/claude-code/bin/claude.exe"):
        found = sorted(Path(root).rglob(relative))
        if found:
            return found[0]
    raise AssertionError(f"Claude Code is installed at {root} but its binary is not there")


def test_claude_code_validates_the_plugin(tmp_path):
    binary = claude_binary()
    env = {**os.environ, "HOME": str(tmp_path), "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    result = subprocess.run([str(binary), "plugin", "validate", "--strict", str(PLUGIN)], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr  # it checks the manifest and every command


def test_claude_code_loads_the_commands_and_the_skill(tmp_path):
    """A session started with the plugin lists /lego:doctor ... in its init event, emitted before any model call
    (the API is a closed port here: the session is ended once the event is read)."""
    import select

    binary = claude_binary()
    env = {**os.environ, "HOME": str(tmp_path), "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
           "ANTHROPIC_BASE_URL": "http://127.0.0.1:9", "ANTHROPIC_API_KEY": "not-used"}
    session = subprocess.Popen([str(binary), "-p", "hi", "--output-format", "stream-json", "--verbose",
                                "--max-turns", "1", "--plugin-dir", str(PLUGIN)],
                               env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        ready, _, _ = select.select([session.stdout], [], [], 60)
        assert ready, "Claude Code wrote no init event within 60 s"
        init = json.loads(session.stdout.readline())
    finally:
        session.kill()
        session.wait()
    assert init["type"] == "system" and init["subtype"] == "init"
    assert {"lego:doctor", "lego:run", "lego:status", "lego:dashboard"} <= set(init["slash_commands"])
    assert "lego:lego-training" in init["skills"]
