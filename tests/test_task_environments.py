"""Task environments with dependencies: a task set from real PyPI packages, one of which (bleach) cannot even be
imported without its runtime dependencies, validates gold `resolved` / empty `unresolved` on every task, with
each environment built offline from packages fetched on the host; a task that lacks what its suite needs is
reported with advice a user can act on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lego.tasksets.environment import EnvironmentSpec, spec_from_swebench
from lego.tasksets.testdeps import read_test_dependencies

NEEDS_DEPENDENCIES = "bleach==6.1.0"  # imports six and webencodings; neither is in the base image
# One package needing nothing more, synthesized through the library (bleach goes through the CLI). A third one
# (inflection==0.5.1, seed 0) went the same two paths again: its synthesis and gradings cost a third of the test.
PLAIN = ("parse==1.20.2",)
# The mutation order's seed per package: one whose first detected mutation breaks a few tests. A grading runs each
# FAIL_TO_PASS test alone besides the whole files, so a mutation that breaks forty tests costs minutes a grading
# and proves nothing more here.
SEEDS = {"bleach": 4, "parse": 4}


# ---------------------------------------------------------------- reading and declaring (no Docker)


def test_test_dependencies_are_read_from_extras_requirement_files_and_tox(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "demo"\nversion = "1"\ndependencies = ["attrs>=22", "tomli; python_version < \'3.11\'"]\n'
        '[project.optional-dependencies]\ntest = ["pytest>=7", "pytest-cov", "wcwidth==0.2.13"]\n'
        'docs = ["sphinx"]\n')
    (tmp_path / "requirements-test.txt").write_text("# for the tests\n-r requirements-base.txt\nhypothesis\n-e .\n")
    (tmp_path / "requirements-base.txt").write_text("six==1.16.0\n")
    (tmp_path / "tox.ini").write_text("[testenv]\ndeps =\n    pytest\n    numpy\n    {env:EXTRA:}\n"
                                      "[testenv:py39-extra]\ndeps = pandas\n")
    found = read_test_dependencies(tmp_path, "demo", python_version="3.11")
    # Runtime and test requirements, markers evaluated for the sandbox's Python; pytest and coverage left out
    # (the sandbox's pytest is the grader's); docs extras and tox factor sections are not the suite's needs.
    assert found.requirements == ["attrs>=22", "hypothesis", "numpy", "six==1.16.0", "wcwidth==0.2.13"]
    assert any("pytest-cov" in item for item in found.dropped)
    assert "pandas" not in json.dumps(found.requirements) and "sphinx" not in json.dumps(found.requirements)


def test_a_pip_only_swebench_spec_becomes_the_environment_and_others_do_not():
    specs = {"owner/repo": {
        "1.0": {"python": "3.11", "packages": "pytest numpy==1.26.4", "pip_packages": ["wcwidth==0.2.13"],
                "install": "python -m pip install -e ."},
        "2.0": {"python": "3.9", "packages": "requirements.txt", "install": "python -m pip install -e ."},
        "3.0": {"python": "3.9", "packages": "", "pre_install": ["apt-get install -y libxml2"]},
    }}
    spec = spec_from_swebench("owner/repo", "1.0", specs)
    assert spec is not None and spec.python == ["numpy==1.26.4", "wcwidth==0.2.13"]
    assert spec.source == "swebench:owner/repo@1.0"
    assert spec_from_swebench("owner/repo", "2.0", specs) is None  # conda/requirements file: not pip-only
    assert spec_from_swebench("owner/repo", "3.0", specs) is None  # apt steps need a network
    assert spec_from_swebench("owner/other", "1.0", specs) is None


def test_a_task_set_declares_environments_per_repo_and_version(tmp_path, calc_task):
    from lego.sandbox.task_image import task_image_tag
    from lego.tasksets.load import load_tasks

    rows = [calc_task.model_copy(update={"instance_id": f"calc__{n}", "version": version}).model_dump(mode="json")
            for n, version in ((1, "1.0"), (2, "1.0"), (3, "2.0"))]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "environments.json").write_text(json.dumps(
        {calc_task.repo: {"1.0": {"python": ["wcwidth==0.2.13", "six==1.16.0"]}}}))
    tasks = {task.instance_id: task for task in load_tasks(tmp_path / "tasks.jsonl", strict=True).tasks}
    assert tasks["calc__1"].environment.requires.python == ["wcwidth==0.2.13", "six==1.16.0"]
    assert tasks["calc__3"].environment.requires is None
    # One spec, one environment image; the order packages are listed in does not matter.
    same = EnvironmentSpec(python=["six==1.16.0", "wcwidth==0.2.13"])
    assert tasks["calc__1"].environment.requires.key() == tasks["calc__2"].environment.requires.key() == same.key()
    assert task_image_tag(tasks["calc__1"], "base:x") != task_image_tag(tasks["calc__3"], "base:x")
    with pytest.raises(ValueError, match="not a pip requirement"):
        EnvironmentSpec(python=["numpy=1.2"])


# ---------------------------------------------------------------- real packages, real sandboxes


@pytest.fixture(scope="module")
def pypi_task_set(tmp_path_factory, lego_config) -> Path:
    """One task per package: bleach through `lego tasks synth --pypi`, the other through the library."""
    from lego.tasksets.synth import synthesize
    from lego_cli import app

    root = tmp_path_factory.mktemp("pypi-set")
    rows = []
    result = CliRunner().invoke(app, ["tasks", "synth", "-c", "test", "--pypi", NEEDS_DEPENDENCIES, "--out",
                                      str(root / "bleach"), "--max-tasks", "1", "--max-candidates", "6",
                                      "--seed", str(SEEDS["bleach"])])
    assert result.exit_code == 0, result.output
    rows += [json.loads(line) for line in (root / "bleach" / "tasks.jsonl").read_text().splitlines()]
    for requirement in PLAIN:
        name = requirement.split("==")[0]
        report = synthesize(requirement=requirement, out_dir=root / name, max_tasks=1, max_candidates=6,
                            seed=SEEDS[name])
        rows += [task.model_dump(mode="json", exclude_none=True) for task in report.tasks]
    for row in rows:  # one task set: bundle paths relative to its file
        package = row["provenance"]["package"]
        row["environment"]["bundle"] = f"{package}/repos/{package}.bundle"
    (root / "tasks.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return root / "tasks.jsonl"


@pytest.mark.docker
def test_a_task_set_from_two_pypi_packages_validates(pypi_task_set, verifier):
    from lego.tasksets.load import load_tasks
    from lego.verify.validate import validate_tasks

    tasks = load_tasks(pypi_task_set, strict=True).tasks
    assert {task.provenance["package"] for task in tasks} == {"bleach", "parse"}
    bleach = [task for task in tasks if task.provenance["package"] == "bleach"]
    assert bleach and all("webencodings==0.6.1" in task.environment.requires.python for task in bleach)
    for task in tasks:
        # PASS_TO_PASS is the whole passing suite: nothing says it was sampled, and it is large.
        assert "pass_to_pass_sample" not in task.provenance
        assert len(task.PASS_TO_PASS) > 50, (task.instance_id, len(task.PASS_TO_PASS))
    report = validate_tasks(verifier, tasks, runs=1, concurrency=2)
    for result in report.tasks:
        assert result.gold == ["resolved"], (result.instance_id, result.evidence, result.advice)
        assert result.empty == ["unresolved"], (result.instance_id, result.evidence)
    assert report.broken == []


@pytest.mark.docker
def test_a_task_without_what_its_suite_needs_is_reported_with_advice(pypi_task_set, verifier):
    from lego.tasksets.load import load_tasks
    from lego.verify import Verifier
    from lego.verify.validate import validate_tasks

    # A suite that cannot be collected is graded infra_error and retried; once is enough to read why.
    verifier = Verifier(verifier.client, verifier.base_image, None, verifier.config.model_copy(
        update={"infra_retries": 0}), factory=verifier.factory)

    bleach = next(task for task in load_tasks(pypi_task_set, strict=True).tasks
                  if task.provenance["package"] == "bleach")
    bare = bleach.model_copy(update={"instance_id": "bleach__no-env", "environment": bleach.environment.model_copy(
        update={"requires": None})})
    # A CSS test: its module starts with pytest.importorskip("tinycss2"), which the environment does not declare.
    css = bleach.model_copy(update={"instance_id": "bleach__css-skipped",
                                    "PASS_TO_PASS": [*bleach.PASS_TO_PASS, "tests/test_css.py::test_valid_css"]})
    report = {result.instance_id: result for result in
              validate_tasks(verifier, [bare, css], runs=1, concurrency=2).tasks}
    advice = " ".join(report["bleach__no-env"].advice)
    # bleach imports six, then webencodings: the first one missing is the one named.
    assert report["bleach__no-env"].broken and "no module 'six'" in advice, report["bleach__no-env"]
    assert "environment.requires.python" in advice
    advice = " ".join(report["bleach__css-skipped"].advice)
    assert report["bleach__css-skipped"].problems == ["gold_not_resolved"]
    assert "tests/test_css.py::test_valid_css" in advice and "tinycss2" in advice, report["bleach__css-skipped"]


@pytest.mark.docker
def test_debian_packages_are_installed_without_a_network(docker_engine, base_image):
    from lego.sandbox.env_image import ensure_env_image

    spec = EnvironmentSpec(debian=["jq"], python=["wcwidth==0.2.13"], setup=["jq --version > /opt/jq-version"])
    tag = ensure_env_image(docker_engine.client, spec, base_image)
    # Detached, then waited on and removed here: with remove=True the engine may remove a container this quick
    # before its logs are read (409 "dead or marked for removal").
    container = docker_engine.client.containers.run(
        tag, ["bash", "-c", "cat /opt/jq-version; echo '{\"a\": 2}' | jq .a; python3 -c 'import wcwidth; "
                            "print(wcwidth.__version__)'"], network_mode="none", detach=True)
    try:
        container.wait(timeout=120)
        output = container.logs(stdout=True, stderr=False).decode()
    finally:
        container.remove(force=True)
    assert output.split() == ["jq-1.6", "2", "0.2.13"], output
    assert ensure_env_image(docker_engine.client, spec.model_copy(update={"source": "elsewhere"}), base_image) == tag
