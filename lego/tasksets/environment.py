"""What a task's environment needs beyond the base image and the repository: Python packages, Debian packages,
setup commands (`EnvironmentSpec`, the `environment.requires` field of a task).

A spec comes from the task itself, from the task set (`environments.json` next to its tasks file, keyed by repo
and version as SWE-bench's own specs are), or from the `swebench` package's spec for the row's repo and version
where that spec is pip-only. Images are built from it offline by lego/sandbox/env_image.py, keyed by `key()`,
so tasks that share a spec share an image.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from pydantic import BaseModel, ConfigDict, Field, field_validator

from lego.cache import content_hash
from lego.errors import LegoError

ENVIRONMENTS_FILE = "environments.json"
_DEBIAN_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]+(=[A-Za-z0-9.+:~-]+)?$")


class EnvironmentSpecError(LegoError):
    """A task set's environment spec is malformed; the message names the entry and what to write instead."""


class EnvironmentSpec(BaseModel):
    """What the sandbox needs installed for the task's tests to run.

    python: pip requirement strings, pinned (`name==version`) for a reproducible image.
    debian: Debian package names (optionally `name=version`) of the base image's suite.
    setup: shell commands run as root after the installs, in `/`, without a network.
    source: where the spec came from (documentation only: not part of the image key).
    """

    model_config = ConfigDict(extra="forbid")

    python: list[str] = Field(default_factory=list)
    debian: list[str] = Field(default_factory=list)
    setup: list[str] = Field(default_factory=list)
    source: str | None = None

    @field_validator("python")
    @classmethod
    def _requirements(cls, value: list[str]) -> list[str]:
        for item in value:
            try:
                Requirement(item)
            except InvalidRequirement as exc:
                raise ValueError(f"{item!r} is not a pip requirement (write it as name==version): {exc}") from exc
        return value

    @field_validator("debian")
    @classmethod
    def _debian_names(cls, value: list[str]) -> list[str]:
        for item in value:
            if not _DEBIAN_NAME.match(item):
                raise ValueError(f"{item!r} is not a Debian package name (write it as name or name=version)")
        return value

    @property
    def empty(self) -> bool:
        return not (self.python or self.debian or self.setup)

    def key(self) -> str:
        """The content hash images are keyed by: package order does not matter, command order does."""
        return content_hash(json.dumps({"python": sorted(set(self.python)), "debian": sorted(set(self.debian)),
                                        "setup": self.setup}, sort_keys=True), length=16)


# ---------------------------------------------------------------- specs from the task set and from swebench


def load_environments_file(base_dir: Path | None) -> dict[tuple[str, str], EnvironmentSpec]:
    """`environments.json` next to a task set: {"owner/repo": {"version": spec, ...}, ...}; {} when absent."""
    if base_dir is None or not (base_dir / ENVIRONMENTS_FILE).is_file():
        return {}
    path = base_dir / ENVIRONMENTS_FILE
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise EnvironmentSpecError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise EnvironmentSpecError(f"{path} must map repo -> version -> spec, e.g. "
                                   '{"owner/repo": {"1.0": {"python": ["wcwidth==0.2.13"]}}}')
    table = {}
    for repo, versions in raw.items():
        if not isinstance(versions, dict):
            raise EnvironmentSpecError(f"{path}: {repo!r} must map versions to specs, got {type(versions).__name__}")
        for version, spec in versions.items():
            try:
                table[(repo, str(version))] = EnvironmentSpec.model_validate(
                    {"source": f"{ENVIRONMENTS_FILE}:{repo}@{version}", **spec})
            except (ValueError, TypeError) as exc:
                raise EnvironmentSpecError(f"{path}: the spec of {repo} {version} is malformed: {exc}") from exc
    return table


@functools.cache
def swebench_specs() -> dict[str, dict[str, dict]]:
    """SWE-bench's per repo and version install specs, where the installed `swebench` package carries them.

    swebench 2.x-4.x keep them in `swebench.harness.constants.MAP_REPO_VERSION_TO_SPECS`; 5.x ships none, so its
    version is read first: importing its harness takes seconds, in every process that loads a task set.
    """
    from importlib.metadata import PackageNotFoundError, version

    try:
        if int(version("swebench").split(".")[0]) >= 5:
            return {}
        from swebench.harness import constants
    except (PackageNotFoundError, ValueError, ImportError):
        return {}
    return getattr(constants, "MAP_REPO_VERSION_TO_SPECS", None) or {}


def spec_from_swebench(repo: str, version: str, specs: dict[str, dict[str, dict]] | None = None) -> EnvironmentSpec | None:
    """The pip-only SWE-bench spec of a repo and version as an EnvironmentSpec, or None.

    Pip-only: its `packages` is a list of requirements (not a requirements.txt or environment.yml to resolve
    with conda) and it has no `pre_install` (apt and shell steps that assume a network). Its `install` step
    (usually `pip install -e .`) is left out: a bundle task's tests run from the repository root.
    """
    spec = (specs if specs is not None else swebench_specs()).get(repo, {}).get(version)
    if not spec or spec.get("pre_install"):
        return None
    packages = spec.get("packages", "")
    if packages in ("requirements.txt", "environment.yml"):
        return None
    requirements = [*packages.split(), *spec.get("pip_packages", [])] if isinstance(packages, str) else \
        [*packages, *spec.get("pip_packages", [])]
    kept = []
    for item in requirements:
        try:
            requirement = Requirement(item)
        except InvalidRequirement:
            return None  # a conda-style `name=version` entry: not pip-only after all
        # The sandbox's pytest is the grading runner's own (Debian's python3-pytest, fingerprinted by it).
        if requirement.name.lower() != "pytest":
            kept.append(item)
    return EnvironmentSpec(python=kept, source=f"swebench:{repo}@{version}")


def spec_for(repo: str, version: str, table: dict[tuple[str, str], EnvironmentSpec]) -> EnvironmentSpec | None:
    """The task set's spec for a row, else SWE-bench's pip-only one, else None."""
    return table.get((repo, version)) or spec_from_swebench(repo, version)


def with_requirements(row: dict[str, Any], table: dict[tuple[str, str], EnvironmentSpec]) -> dict[str, Any]:
    """A row whose environment builds on the base image (a bundle) and declares no `requires` gets the spec of its
    repo and version, when there is one. Prebuilt images (SWE-bench's own) carry their environment already."""
    env = row.get("environment")
    if not isinstance(env, dict) or env.get("kind", "bundle") != "bundle" or env.get("requires"):
        return row
    spec = spec_for(str(row.get("repo", "")), str(row.get("version", "0")), table)
    if spec is None:
        return row
    return {**row, "environment": {**env, "requires": spec.model_dump(exclude_none=True)}}
