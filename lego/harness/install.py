"""Installing a harness once per machine, under lego.cache.cache_dir("harness", name, version).

npm harnesses go to `<dir>/install/node_modules` (installed in a temp dir, then renamed: relocatable, atomic).
Python harnesses get their own venv at `<dir>/venv` (venvs are not relocatable: built in place under a lock and
marked complete last). `uv` is used when it can be had (it resolves in seconds where pip takes minutes); pip
otherwise. A file lock makes concurrent callers (parallel rollouts, two processes) wait for one install.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from lego.cache import cache_dir
from lego.errors import tail
from lego.harness.base import HarnessAdapter, HarnessError, resolve_version

MARKER = ".lego-installed"
INSTALL_TIMEOUT_S = 1800
BYTECODE = "bytecode"  # the marker's field saying the venv's modules are compiled (installs before it were not)


@contextmanager
def _locked(directory: Path):
    with open(directory / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def install_dir(adapter: HarnessAdapter, version: str | None = None) -> Path:
    return cache_dir("harness", adapter.spec.name, resolve_version(adapter, version))


def is_installed(adapter: HarnessAdapter, version: str | None = None) -> bool:
    return (install_dir(adapter, version) / MARKER).is_file()


def _run(command: list[str], what: str, env: dict[str, str] | None = None) -> None:
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S,
                                env={**os.environ, **(env or {})})
    except FileNotFoundError as exc:
        raise HarnessError(f"{what}: {command[0]} is not installed ({exc})") from exc
    except subprocess.TimeoutExpired as exc:
        raise HarnessError(f"{what}: timed out after {INSTALL_TIMEOUT_S}s ({' '.join(command)})") from exc
    if result.returncode != 0:
        raise HarnessError(f"{what} failed (exit {result.returncode}): {' '.join(command)}\n"
                           f"{tail(result.stdout + result.stderr)}")


def _runs_as(binary: str, version: str) -> bool:
    """Whether `binary` starts and is Python `version` (a pyenv shim on PATH may name a version it cannot run)."""
    try:
        result = subprocess.run([binary, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0 and result.stdout.strip() == version


def find_python(version: str) -> str:
    """An interpreter for `version` (e.g. "3.12"): this one, python3.X on PATH, or a pyenv install."""
    if f"{sys.version_info.major}.{sys.version_info.minor}" == version:
        return sys.executable
    found = shutil.which(f"python{version}")
    if found and _runs_as(found, version):
        return found
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    for candidate in sorted(pyenv.glob(f"{version}.*"), reverse=True):
        binary = candidate / "bin" / f"python{version}"
        if binary.is_file() and _runs_as(str(binary), version):
            return str(binary)
    raise HarnessError(f"Python {version} is needed for this harness and none was found; install it "
                       f"(for example `pyenv install {version}`) and put python{version} on PATH")


def find_uv() -> str | None:
    """uv on PATH, or one kept in the cache (installed there with pip the first time)."""
    found = shutil.which("uv")
    if found:
        return found
    tools = cache_dir("tools", "uv")
    binary = tools / "venv" / "bin" / "uv"
    if binary.is_file():
        return str(binary)
    with _locked(tools):
        if binary.is_file():
            return str(binary)
        try:
            _run([sys.executable, "-m", "venv", str(tools / "venv")], "creating a venv for uv")
            _run([str(tools / "venv" / "bin" / "python"), "-m", "pip", "install", "-q", "uv"], "installing uv")
        except HarnessError:
            shutil.rmtree(tools / "venv", ignore_errors=True)
            return None
    return str(binary) if binary.is_file() else None


def _install_npm(adapter: HarnessAdapter, version: str, directory: Path) -> None:
    if shutil.which("npm") is None:
        raise HarnessError(f"installing {adapter.spec.name} needs npm (Node.js); install nodejs and npm")
    staging = directory / f".staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    packages = [spec.format(version=version) for spec in adapter.spec.packages]
    try:
        _run(["npm", "install", "--prefix", str(staging), "--no-audit", "--no-fund", "--no-save", *packages],
             f"npm install of {adapter.spec.name} {version}")
        target = directory / "install"
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _install_venv(adapter: HarnessAdapter, version: str, directory: Path) -> None:
    venv = directory / "venv"
    shutil.rmtree(venv, ignore_errors=True)
    python = find_python(adapter.spec.python or f"{sys.version_info.major}.{sys.version_info.minor}")
    packages = [spec.format(version=version) for spec in adapter.spec.packages]
    uv = find_uv()
    try:
        if uv:
            _run([uv, "venv", "-q", "--python", python, str(venv)], f"creating the venv of {adapter.spec.name}",
                 env={"UV_PYTHON_DOWNLOADS": "never"})
            _run([uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), *packages],
                 f"installing {adapter.spec.name} {version}", env={"UV_PYTHON_DOWNLOADS": "never"})
        else:
            _run([python, "-m", "venv", str(venv)], f"creating the venv of {adapter.spec.name}")
            _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *packages],
                 f"installing {adapter.spec.name} {version}")
    except BaseException:
        shutil.rmtree(venv, ignore_errors=True)
        raise


def _compile_bytecode(venv: Path) -> None:
    """Compile the venv's modules with its own Python (the bytecode must match its version). Best effort: some
    packages ship files that are not valid Python (templates, test data), which compileall reports and skips."""
    try:
        subprocess.run([str(venv / "bin" / "python"), "-m", "compileall", "-q", "-j", "0", str(venv / "lib")],
                       capture_output=True, timeout=INSTALL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        pass  # slower harness starts, nothing worse


def _marker(directory: Path) -> dict | None:
    try:
        return json.loads((directory / MARKER).read_text())
    except (OSError, ValueError):
        return None


def _ready(adapter: HarnessAdapter, directory: Path) -> bool:
    marker = _marker(directory)
    return marker is not None and (adapter.spec.install_kind == "npm" or bool(marker.get(BYTECODE)))


def ensure_installed(adapter: HarnessAdapter, version: str | None = None) -> Path:
    """The harness's install directory, installing it first when it is not in the cache yet (an older venv
    install without bytecode gets it compiled)."""
    version = resolve_version(adapter, version)
    directory = install_dir(adapter, version)
    if _ready(adapter, directory):
        return directory
    with _locked(directory):
        if _ready(adapter, directory):
            return directory
        started = time.monotonic()
        marker = _marker(directory) or {}
        if not marker:
            if adapter.spec.install_kind == "npm":
                _install_npm(adapter, version, directory)
            else:
                _install_venv(adapter, version, directory)
        if adapter.spec.install_kind != "npm":
            _compile_bytecode(directory / "venv")
            marker[BYTECODE] = True
        (directory / MARKER).write_text(json.dumps({
            "harness": adapter.spec.name, "version": version, "packages": list(adapter.spec.packages),
            "seconds": round(time.monotonic() - started, 1), **marker}))
    return directory
