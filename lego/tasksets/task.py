"""The task model: a SWE-bench instance plus where its environment comes from."""

from __future__ import annotations

import json
import shlex
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from lego.errors import LegoError
from lego.tasksets.environment import EnvironmentSpec

PYTEST_PREFIXES = ("python3 -m pytest", "python -m pytest", "pytest")

NO_FAIL_TO_PASS_WHY = ("an empty patch would resolve it, since zero FAIL_TO_PASS and PASS_TO_PASS tests count as a "
                       "full pass")


class NoFailToPass(ValueError):
    """A task without a FAIL_TO_PASS test: nothing grades it, so any patch (the empty one too) resolves it."""


class Environment(BaseModel):
    """Where the repository at base_commit comes from.

    - image: a ready Docker image with the repo at `workdir` (SWE-bench images).
    - bundle: a git bundle built into an image on the base image.
    - dockerfile: a Harbor-style environment directory with a Dockerfile.

    A task set's file may name `bundle` and `dockerfile_dir` relative to itself; the loaders
    (lego/tasksets/load.py) make them absolute, so a loaded Task needs no task-set root.
    """

    model_config = ConfigDict(extra="forbid")

    kind: Literal["image", "bundle", "dockerfile"] = "bundle"
    image: str | None = None
    bundle: str | None = None
    dockerfile_dir: str | None = None
    workdir: str = "/repo"
    setup_commands: list[str] = Field(default_factory=list)
    # What the tests need installed (Python and Debian packages, setup commands), built into an image shared by
    # every task with the same spec, offline (lego/sandbox/env_image.py). None: the base image as it is.
    requires: EnvironmentSpec | None = None


class Task(BaseModel):
    model_config = ConfigDict(extra="allow")

    instance_id: str = Field(min_length=1)
    repo: str = Field(min_length=1)
    base_commit: str = Field(min_length=1)
    problem_statement: str = Field(min_length=1)
    patch: str = ""
    test_patch: str = ""
    # At least one: a test that fails at base_commit and passes with the gold patch (see _needs_a_failing_test).
    FAIL_TO_PASS: list[str] = Field(default_factory=list, validate_default=True)
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    version: str = "0"
    environment_setup_commit: str | None = None
    hints_text: str = ""
    created_at: str = ""
    split: str = "train"
    difficulty: str | None = None
    environment: Environment = Field(default_factory=Environment)
    test_command: str = "python3 -m pytest -rA -p no:cacheprovider"
    provenance: dict[str, Any] = Field(default_factory=dict)

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _json_list(cls, value: Any) -> Any:
        # The public SWE-bench datasets store these as JSON strings.
        if isinstance(value, str):
            try:
                value = json.loads(value) if value.strip() else []
            except json.JSONDecodeError as exc:
                raise ValueError(f"not a JSON list of test names: {exc}") from exc
        if value is None:
            return []
        return value

    @model_validator(mode="after")
    def _needs_a_failing_test(self) -> Task:
        # Without a FAIL_TO_PASS test nothing grades a SWE-bench-format task: every patch would resolve it, and
        # training would reward doing nothing. A Harbor task is graded by its tests/test.sh instead
        # (lego/verify/harbor_grading.py), so its grading recipe stands in for the lists.
        if not [name for name in self.FAIL_TO_PASS if name.strip()] and not is_harbor_task(self):
            raise NoFailToPass(
                f"task {self.instance_id!r} has no FAIL_TO_PASS test: {NO_FAIL_TO_PASS_WHY}. List the tests that "
                "fail at base_commit and pass with the gold patch in FAIL_TO_PASS, or drop the task"
            )
        return self

    @property
    def test_files(self) -> list[str]:
        """Files the test_patch touches (hidden from the agent)."""
        return patch_files(self.test_patch)


def patch_files(patch: str) -> list[str]:
    files = []
    for line in patch.splitlines():
        if line.startswith("diff --git "):
            parts = line.split()
            if len(parts) >= 4:
                files.append(parts[3][2:] if parts[3].startswith("b/") else parts[3])
    return files


def harbor_recipe(task: Task) -> dict[str, Any] | None:
    """The Harbor grading recipe a task carries (provenance["harbor"], from lego.tasksets.load), or None."""
    provenance = task.provenance if isinstance(task.provenance, dict) else {}
    recipe = provenance.get("harbor")
    if provenance.get("source") == "harbor" and isinstance(recipe, dict) and recipe.get("tests_dir"):
        return recipe
    return None


def is_harbor_task(task: Task) -> bool:
    """Graded by running its tests/test.sh (Harbor's verifier) rather than by FAIL_TO_PASS/PASS_TO_PASS. A task
    Lego exported as a Harbor directory carries its tests too, and is graded by them (with decoys) when loaded back."""
    recipe = harbor_recipe(task)
    return recipe is not None and recipe.get("graded_by") != "lego"


def has_harbor_environment(task: Task) -> bool:
    """Its environment is a Harbor task directory's Dockerfile (a working dir that is no git repository)."""
    return harbor_recipe(task) is not None


class TaskSetError(LegoError):
    """A task set could not be loaded, or (strict mode) some of its rows are malformed."""


class UnsupportedTestCommand(LegoError):
    """The task's test_command is not a pytest invocation, which is what the grading runner runs."""


def graded_test_files(task: Task) -> list[str]:
    files = [test.split("::")[0] for test in [*task.FAIL_TO_PASS, *task.PASS_TO_PASS]]
    return sorted(dict.fromkeys(f for f in files if f))


def pytest_command_of(task: Task) -> tuple[dict[str, str], list[str]]:
    """The environment assignments and the arguments of the task's pytest command (`[VAR=value ...] python3 -m
    pytest [ARGS]`); its interpreter and entry point are the runner's own."""
    words = shlex.split(task.test_command)
    env: dict[str, str] = {}
    while words and "=" in words[0] and words[0].split("=", 1)[0].isidentifier():
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    for prefix in PYTEST_PREFIXES:
        head = prefix.split()
        if words[:len(head)] == head:
            return env, words[len(head):]
    raise UnsupportedTestCommand(
        f"task {task.instance_id}: test_command {task.test_command!r} is not a pytest command; the grader runs "
        f"FAIL_TO_PASS/PASS_TO_PASS with pytest (write it as `[VAR=value ...] python3 -m pytest [ARGS]`)")
