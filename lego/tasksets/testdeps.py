"""What a package's test suite needs installed, read from its source tree.

Read, in this order, and merged:
  - its runtime dependencies: pyproject's [project].dependencies, else PKG-INFO's Requires-Dist without an
    extra, else *.egg-info/requires.txt (setup.py is not executed);
  - its test extras (test, tests, testing) from the same three places, and PEP 735 dependency groups of those names;
  - requirements files named for tests (requirements-test.txt, test-requirements.txt, requirements/test*.txt,
    tests/requirements*.txt);
  - tox.ini's base [testenv] `deps` (and the extras its `extras` names); factor sections such as py39-extra are
    optional runs, not the suite's requirements.
Environment markers are evaluated for the sandbox's Python. Tools that do not make a test pass (coverage,
linters, formatters, docs, packaging) are dropped, and so is pytest: the sandbox's pytest is the grader's.
"""

from __future__ import annotations

import configparser
import email.parser
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

TEST_EXTRAS = ("test", "tests", "testing")
NOT_FOR_TESTS = re.compile(
    r"^(pytest|pytest-cov|coverage|coveralls|codecov|tox|tox-.+|flake8(-.+)?|black|mypy|types-.+|pylint|ruff|isort|"
    r"pre-commit|twine|build|wheel|setuptools|setuptools-scm|sphinx(-.+)?|check-manifest|bump2version|pyroma|"
    r"readme-renderer|docutils|pip|virtualenv)$")
_REQUIREMENT_FILES = ("requirements*test*.txt", "test*requirements*.txt", "requirements/test*.txt",
                      "tests/requirements*.txt", "test/requirements*.txt")


@dataclass
class TestDependencies:
    requirements: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)  # where each group came from, for the task's provenance
    dropped: list[str] = field(default_factory=list)  # declared but not needed to run the tests


def _environment(python_version: str) -> dict[str, str]:
    env = dict(default_environment())
    env.update(python_version=python_version, python_full_version=f"{python_version}.0")
    return env


def _requirement_lines(path: Path, seen: set[Path] | None = None) -> list[str]:
    """The requirements of a requirements file, following `-r`; editable installs and options skipped."""
    seen = seen or set()
    if path in seen or not path.is_file():
        return []
    seen.add(path)
    found = []
    for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith(("-r", "--requirement")):
            name = line.split(None, 1)[1] if " " in line else line[2:]
            found += _requirement_lines((path.parent / name.strip()).resolve(), seen)
        elif not line.startswith("-") and not line.startswith("."):
            found.append(line)
    return found


def _extras_from_requires_txt(text: str) -> dict[str, list[str]]:
    """*.egg-info/requires.txt: top lines are runtime; `[extra]` or `[extra:marker]` sections follow."""
    sections: dict[str, list[str]] = {"": []}
    current, marker = "", ""
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("[") and line.endswith("]"):
            current, _, marker = line[1:-1].partition(":")
            sections.setdefault(current, [])
            continue
        sections[current].append(f"{line}; {marker}" if marker and ";" not in line else line)
    return sections


def read_test_dependencies(root: Path, package: str, python_version: str = "3.11") -> TestDependencies:
    """The requirements `root`'s test suite needs besides pytest; see the module docstring."""
    result = TestDependencies()
    collected: list[tuple[str, str]] = []  # (requirement, source)
    pyproject = {}
    if (root / "pyproject.toml").is_file():
        try:
            pyproject = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError:
            pyproject = {}
    project = pyproject.get("project") or {}
    if "dependencies" in project or project.get("optional-dependencies"):
        collected += [(item, "pyproject dependencies") for item in project.get("dependencies", [])]
        for extra in TEST_EXTRAS:
            collected += [(item, f"pyproject extra {extra}")
                          for item in (project.get("optional-dependencies") or {}).get(extra, [])]
    else:
        collected += _from_package_metadata(root)
    for group in TEST_EXTRAS:
        for item in (pyproject.get("dependency-groups") or {}).get(group, []):
            if isinstance(item, str):
                collected.append((item, f"dependency group {group}"))
    for pattern in _REQUIREMENT_FILES:
        for path in sorted(root.glob(pattern)):
            collected += [(item, path.relative_to(root).as_posix()) for item in _requirement_lines(path)]
    collected += _from_tox(root, package)

    env = _environment(python_version)
    own = canonicalize_name(package)
    kept: dict[str, str] = {}
    for item, source in collected:
        try:
            requirement = Requirement(item)
        except InvalidRequirement:
            result.dropped.append(f"{item} ({source}: not a requirement)")
            continue
        name = canonicalize_name(requirement.name)
        if name == own:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate({**env, "extra": ""}):
            continue
        if NOT_FOR_TESTS.match(name):
            result.dropped.append(f"{requirement.name} ({source})")
            continue
        requirement.marker = None
        if name not in kept:
            kept[name] = str(requirement)
            if source not in result.sources:
                result.sources.append(source)
    result.requirements = sorted(kept.values(), key=str.lower)
    return result


def _from_package_metadata(root: Path) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    pkg_info = root / "PKG-INFO"
    if pkg_info.is_file():
        message = email.parser.Parser().parsestr(pkg_info.read_text(encoding="utf-8", errors="replace"))
        for item in message.get_all("Requires-Dist") or []:
            requirement = Requirement(item)
            extra = next((e for e in TEST_EXTRAS if requirement.marker and requirement.marker.evaluate(
                {**_environment("3.11"), "extra": e})), None)
            if requirement.marker is None or "extra" not in str(requirement.marker):
                found.append((item, "PKG-INFO Requires-Dist"))
            elif extra:
                requirement.marker = None
                found.append((str(requirement), f"PKG-INFO extra {extra}"))
        if found:
            return found
    for requires in sorted(root.glob("*.egg-info/requires.txt")):
        sections = _extras_from_requires_txt(requires.read_text(encoding="utf-8", errors="replace"))
        found += [(item, "egg-info requires.txt") for item in sections.get("", [])]
        for extra in TEST_EXTRAS:
            found += [(item, f"egg-info extra {extra}") for item in sections.get(extra, [])]
    return found


def _from_tox(root: Path, package: str) -> list[tuple[str, str]]:
    path = root / "tox.ini"
    if not path.is_file():
        return []
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        parser.read_string(path.read_text(encoding="utf-8", errors="replace"))
    except configparser.Error:
        return []
    if not parser.has_section("testenv"):
        return []
    found: list[tuple[str, str]] = []
    for line in parser.get("testenv", "deps", fallback="").splitlines():
        line = line.strip()
        if not line or "{" in line or line.startswith("#"):
            continue  # tox substitutions name other files or factors: not resolvable here
        if line.startswith("-r"):
            target = root / line[2:].strip()
            found += [(item, f"tox.ini -> {target.name}") for item in _requirement_lines(target)]
        elif not line.startswith(("-", ".")):
            found.append((line, "tox.ini [testenv] deps"))
    extras = [e.strip() for e in re.split(r"[,\s]+", parser.get("testenv", "extras", fallback="")) if e.strip()]
    if extras and (root / "pyproject.toml").is_file():
        try:
            optional = (tomllib.loads((root / "pyproject.toml").read_text()).get("project") or {}).get(
                "optional-dependencies") or {}
        except tomllib.TOMLDecodeError:
            optional = {}
        for extra in extras:
            found += [(item, f"tox.ini extras {extra}") for item in optional.get(extra, [])]
    return found
