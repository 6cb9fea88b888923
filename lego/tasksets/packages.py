"""Fetching an environment's packages on the host, so that nothing built from them needs a network.

Python: `pip wheel` with the host's interpreter, through whatever index pip is configured with (pip.conf,
PIP_INDEX_URL), into a wheelhouse under the download cache keyed by the requirements and the interpreter. `pip
wheel` rather than `pip download --platform`: it also turns sdist-only packages into wheels, which an offline
build could not do without their build backends. The cost is that binary wheels are for the host's Python; the
image builder checks that the sandbox's Python has the same minor version and says so when it does not.

Debian: `apt-get install --download-only` on the host, with the base image's own dpkg status file, so apt picks
exactly the packages (and dependencies) the image lacks, from the host's apt sources. Chosen over a build step
with a network because the build then never has one (the engine here has no bridge network anyway); it needs a
host of the image's Debian suite, which the base image's debootstrap already needs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import venv
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

from lego.cache import cache_dir, content_hash
from lego.errors import LegoError, tail

WHEELHOUSE_VERSION = "1"
COMPLETE = ".complete"
# The pytest synthesis runs suites with: the sandbox's own (Debian bookworm's python3-pytest), so that what passes
# on the host is what the grader, which runs that pytest, sees pass.
SANDBOX_PYTEST = "pytest==7.2.1"


class PackageFetchError(LegoError):
    """Packages could not be fetched on the host; the message carries the tool's own words and what to change."""


def python_tag() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def wheelhouse(requirements: list[str]) -> Path:
    """A directory holding wheels for `requirements` and all their dependencies (cached; built once)."""
    key = content_hash(WHEELHOUSE_VERSION, python_tag(), sysconfig.get_platform(), *sorted(set(requirements)))
    target = cache_dir("wheelhouse") / key
    if (target / COMPLETE).is_file():
        return target
    with tempfile.TemporaryDirectory(prefix="partial-", dir=cache_dir("wheelhouse")) as scratch:
        command = [sys.executable, "-m", "pip", "wheel", "--disable-pip-version-check", "--wheel-dir", scratch,
                   *requirements]
        proc = subprocess.run(command, capture_output=True, text=True)
        if proc.returncode != 0:
            raise PackageFetchError(
                f"pip could not fetch {' '.join(requirements)} (through the index pip is configured with): "
                f"{tail(proc.stdout + proc.stderr)}\nFix the requirement, or make the index reachable.")
        Path(scratch, COMPLETE).write_text("\n".join(sorted(requirements)) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        os.rename(scratch, target)
        os.makedirs(scratch)  # TemporaryDirectory removes it on exit
    return target


def wheels(directory: Path) -> dict[str, str]:
    """Distribution name -> version of every wheel in a wheelhouse."""
    found = {}
    for path in sorted(directory.glob("*.whl")):
        name, version, _, _ = parse_wheel_filename(path.name)
        found[str(name)] = str(version)
    return found


def pin(requirements: list[str]) -> list[str]:
    """`name==version` for every distribution `requirements` resolve to (their dependencies too): what a task
    records, so that its image is the same wherever and whenever it is built."""
    if not requirements:
        return []
    return [f"{name}=={version}" for name, version in sorted(wheels(wheelhouse(requirements)).items())]


def test_python(requirements: list[str]) -> Path:
    """An interpreter of a host virtual environment with `requirements` and the sandbox's pytest and nothing
    else (cached by content): synthesis runs suites there, so a test passes only with what the task declares."""
    wanted = sorted({*requirements, SANDBOX_PYTEST})
    key = content_hash(WHEELHOUSE_VERSION, python_tag(), sys.executable, *wanted)
    root = cache_dir("venvs") / key
    python = root / "bin" / "python"
    if (root / COMPLETE).is_file():
        return python
    shutil.rmtree(root, ignore_errors=True)
    # A venv records its own path, so it is made in place; the marker says it was finished.
    venv.create(root, with_pip=False, clear=True)
    house = wheelhouse(wanted)
    command = [sys.executable, "-m", "pip", "--python", str(python), "install", "--disable-pip-version-check",
               "--no-index", "--find-links", str(house), *wanted]
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        raise PackageFetchError(f"installing {' '.join(wanted)} into {root} failed: {tail(proc.stdout + proc.stderr)}")
    (root / COMPLETE).write_text("\n".join(wanted) + "\n")
    return python


def requirement_names(requirements: list[str]) -> set[str]:
    from packaging.requirements import Requirement

    return {canonicalize_name(Requirement(item).name) for item in requirements}


def debian_archives(packages: list[str], dpkg_status: bytes, suite: str) -> Path:
    """A directory of the .deb files that installing `packages` on an image with `dpkg_status` needs."""
    key = content_hash(WHEELHOUSE_VERSION, suite, dpkg_status, *sorted(set(packages)))
    target = cache_dir("debs") / key
    if (target / COMPLETE).is_file():
        return target
    codename = _host_codename()
    if codename != suite:
        raise PackageFetchError(
            f"Debian packages {', '.join(packages)} are fetched with the host's apt for the base image's suite "
            f"{suite!r}, but this host is {codename or 'not Debian'}; build this environment on a {suite} host, or "
            "install the packages with environment.requires.setup from files you put in the image yourself")
    if shutil.which("apt-get") is None:
        raise PackageFetchError("apt-get is not installed on this host; it fetches the environment's Debian packages")
    with tempfile.TemporaryDirectory(prefix="partial-", dir=cache_dir("debs")) as scratch:
        status = Path(scratch, "status")
        status.write_bytes(dpkg_status)
        archives = Path(scratch, "archives")
        (archives / "partial").mkdir(parents=True)
        command = ["apt-get", "-y", "-q", "--download-only", "--no-install-recommends",
                   "-o", f"Dir::State::status={status}", "-o", f"Dir::Cache::archives={archives}",
                   "-o", "Debug::NoLocking=1", "install", *packages]
        proc = subprocess.run(command, capture_output=True, text=True)
        if proc.returncode != 0:
            raise PackageFetchError(
                f"apt-get could not fetch {' '.join(packages)}: {tail(proc.stdout + proc.stderr)}\n"
                "Check the package names for the suite; if apt's lists are stale, run `apt-get update`.")
        debs = sorted(archives.glob("*.deb"))
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        for deb in debs:
            shutil.move(str(deb), target / deb.name)
        (target / COMPLETE).write_text("\n".join(deb.name for deb in debs) + "\n")
    return target


def _host_codename() -> str | None:
    path = Path("/etc/os-release")
    if not path.is_file():
        return None
    for line in path.read_text().splitlines():
        if line.startswith("VERSION_CODENAME="):
            return line.split("=", 1)[1].strip().strip('"')
    return None
