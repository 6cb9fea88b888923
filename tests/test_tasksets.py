"""Task sets: the bundled tasks really exhibit their bugs, loaders for every source, synthesis."""

from __future__ import annotations

import json
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lego.config import TaskSetConfig
from lego.sandbox.task_image import UnresolvedTaskPath, task_image_tag
from lego.tasksets.build_bundled import build_history, load_specs
from lego.tasksets.folders import FOLDERS_SUBDIR, check_task_folders, write_task_folders
from lego.tasksets.gitutil import apply_patch, clone, git
from lego.tasksets.load import (
    BUNDLED_DIR,
    BUNDLED_TASKS,
    TaskSetError,
    harbor_task_row,
    load_configured,
    load_tasks,
    validate_rows,
)
from lego.tasksets.synth import synthesize
from lego.tasksets.task import Task
from lego.tasksets.testrun import PASSED, parse_pytest_summary, run_pytest, run_tests

BUNDLED = load_tasks("bundled").tasks


def _raw_rows() -> list[dict]:
    return [json.loads(line) for line in BUNDLED_TASKS.read_text().splitlines() if line.strip()]


# ---------------------------------------------------------------- the bundled set


def test_bundled_set_shape():
    assert len(BUNDLED) >= 16
    repos = {task.repo for task in BUNDLED}
    assert len(repos) >= 4
    assert {task.repo for task in BUNDLED if task.split == "eval"} == repos
    assert {task.difficulty for task in BUNDLED} == {"easy", "medium", "hard"}
    assert any(len(task.provenance["fixed_files"]) > 1 for task in BUNDLED)
    for task in BUNDLED:
        assert task.FAIL_TO_PASS and task.PASS_TO_PASS and task.patch and task.test_patch
        assert not set(task.FAIL_TO_PASS) & set(task.PASS_TO_PASS)
        assert task.environment.kind == "bundle" and Path(task.environment.bundle).is_file()
        assert not set(task.test_files) & set(task.provenance["fixed_files"])


def test_bundled_history_is_reproducible(tmp_path):
    """Rebuilding a repository's history gives the same commit hashes as the committed bundle."""
    base_commits = {task.base_commit for task in BUNDLED}
    for name, spec in load_specs().items():
        commits = build_history(name, spec, tmp_path / name)
        assert base_commits & set(commits), name
        bundle_heads = git(tmp_path, "bundle", "list-heads", str(Path(BUNDLED[0].environment.bundle).parent / f"{name}.bundle"))
        assert commits[-1] in bundle_heads


@pytest.fixture(scope="module")
def clones(tmp_path_factory):
    """One clone per bundle; each task gets a cheap copy checked out at its base commit."""
    root = tmp_path_factory.mktemp("bundles")
    return {bundle: clone(bundle, root / Path(bundle).stem) for bundle in {t.environment.bundle for t in BUNDLED}}


@pytest.mark.parametrize("task", BUNDLED, ids=lambda task: task.instance_id)
def test_bundled_task_fails_then_passes(task, clones, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(clones[task.environment.bundle], repo)
    git(repo, "checkout", "-q", "--detach", task.base_commit)  # the base commit exists in the bundle
    apply_patch(repo, task.test_patch)
    before = run_tests(repo, task.FAIL_TO_PASS + task.PASS_TO_PASS)
    assert [t for t in task.FAIL_TO_PASS if before[t] == PASSED] == []
    assert [t for t in task.PASS_TO_PASS if before[t] != PASSED] == []
    apply_patch(repo, task.patch)
    after = run_tests(repo, task.FAIL_TO_PASS + task.PASS_TO_PASS)
    assert [t for t in task.FAIL_TO_PASS + task.PASS_TO_PASS if after[t] != PASSED] == []


def test_grading_with_swebench_parser(clones, tmp_path):
    """The test ids are the ones swebench's pytest log parser reports, so its grader resolves the gold patch."""
    from swebench.harness.grading import get_eval_tests_report, get_resolution_status
    from swebench.harness.log_parsers.python import parse_log_pytest

    task = next(t for t in BUNDLED if t.difficulty == "hard")
    repo = clone(task.environment.bundle, tmp_path / "repo", task.base_commit)
    apply_patch(repo, task.test_patch)
    _, log = run_pytest(repo)
    assert parse_log_pytest(log, None) == parse_pytest_summary(log)
    report = get_eval_tests_report(parse_log_pytest(log, None), {"FAIL_TO_PASS": task.FAIL_TO_PASS,
                                                                 "PASS_TO_PASS": task.PASS_TO_PASS})
    assert get_resolution_status(report) == "RESOLVED_NO"
    apply_patch(repo, task.patch)
    _, log = run_pytest(repo)
    report = get_eval_tests_report(parse_log_pytest(log, None), {"FAIL_TO_PASS": task.FAIL_TO_PASS,
                                                                 "PASS_TO_PASS": task.PASS_TO_PASS})
    assert get_resolution_status(report) == "RESOLVED_FULL"


def _rows_as_written() -> list[Task]:
    """The bundled tasks as tasks.jsonl holds them (bundle paths relative to the set, as the folders see them)."""
    return [Task.model_validate(row) for row in _raw_rows()]


def test_bundled_task_folders_are_what_tasks_jsonl_holds():
    """The committed folders are exactly those generated from tasks.jsonl: none missing, stale or extra."""
    tasks = _rows_as_written()
    assert check_task_folders(tasks, BUNDLED_DIR) == []
    assert sorted(path.name for path in (BUNDLED_DIR / FOLDERS_SUBDIR).iterdir()) == \
        sorted(task.instance_id for task in tasks)


def test_a_bundled_task_folder_reads_back_as_its_task():
    """Each folder alone gives the task back (what a person reads is the whole task); its bundle path names the
    same file as the JSONL row's."""
    for task, row in zip(BUNDLED, _raw_rows(), strict=True):
        folder = BUNDLED_DIR / FOLDERS_SUBDIR / task.instance_id
        config = tomllib.loads((folder / "task.toml").read_text())
        assert (folder / "instruction.md").read_text() == task.problem_statement
        assert (folder / "solution.patch").read_text() == task.patch
        assert (folder / "tests.patch").read_text() == task.test_patch
        assert (folder / config["environment"]["bundle"]).resolve() == Path(task.environment.bundle)
        tests = config["tests"]
        rebuilt = Task.model_validate({
            **config["metadata"], "test_command": tests["command"], "FAIL_TO_PASS": tests["FAIL_TO_PASS"],
            "PASS_TO_PASS": tests["PASS_TO_PASS"], "provenance": config["provenance"],
            "environment": {**config["environment"], "bundle": row["environment"]["bundle"]},
            "problem_statement": (folder / "instruction.md").read_text(),
            "patch": (folder / "solution.patch").read_text(), "test_patch": (folder / "tests.patch").read_text()})
        assert rebuilt == Task.model_validate(row)


def test_a_stale_task_folder_is_reported(tmp_path):
    tasks = _rows_as_written()[:3]
    write_task_folders(tasks, tmp_path)
    assert check_task_folders(tasks, tmp_path) == []
    first, second, third = (f"{FOLDERS_SUBDIR}/{task.instance_id}" for task in tasks)
    (tmp_path / first / "solution.patch").write_text("edited by hand\n")
    (tmp_path / second / "tests.patch").unlink()
    (tmp_path / third / "notes.txt").write_text("not generated\n")
    assert check_task_folders(tasks, tmp_path) == [f"{second}/tests.patch: missing",
                                                   f"{third}/notes.txt: not generated from any task",
                                                   f"{first}/solution.patch: differs from the task's row"]
    write_task_folders(tasks[:2], tmp_path)  # a removed task loses its folder
    assert check_task_folders(tasks[:2], tmp_path) == [] and not (tmp_path / third).exists()


# ---------------------------------------------------------------- bundle paths: absolute once loaded


def test_a_loaded_task_finds_its_bundle_after_the_pipeline_writes_and_reads_it(tmp_path, monkeypatch):
    """tasks stage: load -> write_tasks -> read_tasks elsewhere; the bundle is found and the image tag is
    the one of the loaded task."""
    from lego.pipeline.taskset_stage import read_tasks, write_tasks

    loaded = load_tasks("bundled", split="all").tasks
    path = write_tasks(tmp_path / "train_tasks.jsonl", loaded)
    monkeypatch.chdir(tmp_path)
    back = read_tasks(path)
    assert back == loaded
    for task in back:
        assert Path(task.environment.bundle).is_absolute() and Path(task.environment.bundle).is_file()
    assert task_image_tag(back[0], "base:1") == task_image_tag(loaded[0], "base:1")


def test_the_task_image_tag_is_keyed_on_the_bundle_content_not_its_path(tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(BUNDLED_DIR / "repos", copy / "repos")
    shutil.copy(BUNDLED_TASKS, copy / "tasks.jsonl")
    moved = {task.instance_id: task for task in load_tasks(copy / "tasks.jsonl").tasks}
    for task in BUNDLED:
        assert moved[task.instance_id].environment.bundle != task.environment.bundle
        assert task_image_tag(moved[task.instance_id], "base:1") == task_image_tag(task, "base:1")
    other = moved[BUNDLED[0].instance_id]
    Path(other.environment.bundle).write_bytes(Path(other.environment.bundle).read_bytes() + b"\n")
    assert task_image_tag(other, "base:1") != task_image_tag(BUNDLED[0], "base:1")


def test_a_relative_bundle_path_outside_a_loader_is_refused_clearly():
    row_task = _rows_as_written()[0]  # as the file holds it: "repos/<name>.bundle"
    assert not Path(row_task.environment.bundle).is_absolute()
    with pytest.raises(UnresolvedTaskPath, match="environment.bundle is the relative path 'repos/.*load_tasks"):
        task_image_tag(row_task, "base:1")


def test_a_source_without_a_directory_refuses_relative_bundle_paths():
    """A hub dataset has no directory to resolve a relative bundle path by: the row is refused at load time."""
    row = _raw_rows()[0]
    absolute = {**row, "instance_id": "absolute",
                "environment": {**row["environment"], "bundle": str(BUNDLED_DIR / row["environment"]["bundle"])}}
    loaded = validate_rows(enumerate([row, absolute], 1), None, "hub dataset some/name")
    assert [task.instance_id for task in loaded.tasks] == ["absolute"]
    (error,) = loaded.errors
    assert (error.row, error.field) == (1, "environment.bundle")
    assert "hub dataset some/name has no directory" in error.reason


# ---------------------------------------------------------------- loaders


def test_bundled_splits_and_limit():
    assert {t.split for t in load_tasks("bundled", split="eval").tasks} == {"eval"}
    assert len(load_tasks("bundled", split="train").tasks) + len(load_tasks("bundled", split="eval").tasks) == len(BUNDLED)
    assert len(load_tasks("bundled", split="all", limit=3).tasks) == 3
    loaded = load_configured(TaskSetConfig(source="bundled", split="eval"))
    assert loaded.tasks and all(t.split == "eval" for t in loaded.tasks)


def _write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("\n".join(row if isinstance(row, str) else json.dumps(row) for row in rows) + "\n")
    return path


def test_jsonl_with_json_string_lists_and_malformed_rows(tmp_path):
    good = _raw_rows()[0]
    swebench_style = {**_raw_rows()[1], "FAIL_TO_PASS": json.dumps(_raw_rows()[1]["FAIL_TO_PASS"]),
                      "PASS_TO_PASS": json.dumps(_raw_rows()[1]["PASS_TO_PASS"])}
    missing_id = {k: v for k, v in _raw_rows()[2].items() if k != "instance_id"}
    bad_list = {**_raw_rows()[3], "FAIL_TO_PASS": "[not json"}
    path = _write_jsonl(tmp_path / "tasks.jsonl", [good, swebench_style, missing_id, "{broken", bad_list, good])

    loaded = load_tasks(path)
    assert [t.instance_id for t in loaded.tasks] == [good["instance_id"], swebench_style["instance_id"]]
    assert loaded.tasks[1].FAIL_TO_PASS == _raw_rows()[1]["FAIL_TO_PASS"]
    # Bundle paths are made absolute against the file's directory only when they exist there.
    assert loaded.tasks[0].environment.bundle == "repos/" + Path(good["environment"]["bundle"]).name
    errors = {(e.row, e.field) for e in loaded.errors}
    assert errors == {(3, "instance_id"), (4, "<row>"), (5, "FAIL_TO_PASS"), (6, "instance_id")}
    reasons = {e.row: e.reason for e in loaded.errors}
    assert "Field required" in reasons[3] and "JSON" in reasons[4] and "not a JSON list" in reasons[5]
    assert "duplicate of row 1" in reasons[6]

    with pytest.raises(TaskSetError) as info:
        load_tasks(path, strict=True)
    message = str(info.value)
    assert "4 malformed row(s)" in message and "row 3: instance_id" in message and "row 5: FAIL_TO_PASS" in message


def test_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = _raw_rows()
    for row in rows:  # the way SWE-bench parquet files store them
        row["FAIL_TO_PASS"] = json.dumps(row["FAIL_TO_PASS"])
        row["PASS_TO_PASS"] = json.dumps(row["PASS_TO_PASS"])
        row["environment"] = json.dumps(row["environment"])
        row["provenance"] = json.dumps(row["provenance"])
    rows[2]["base_commit"] = ""
    shutil.copytree(BUNDLED_TASKS.parent / "repos", tmp_path / "repos")
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "tasks.parquet")

    loaded = load_tasks(tmp_path / "tasks.parquet", split="all")
    assert len(loaded.tasks) == len(rows) - 1
    assert [(e.row, e.field) for e in loaded.errors] == [(3, "base_commit")]
    task = loaded.tasks[0]
    assert task.FAIL_TO_PASS == BUNDLED[0].FAIL_TO_PASS
    assert Path(task.environment.bundle).is_file() and task.provenance["source"] == "bundled"


def test_datasets_saved_to_disk(tmp_path):
    import datasets

    rows = []
    for row in _raw_rows()[:3]:  # SWE-bench columns only: no environment, lists as JSON strings
        rows.append({key: row[key] for key in ("instance_id", "repo", "base_commit", "problem_statement",
                                               "patch", "test_patch", "version")}
                    | {"FAIL_TO_PASS": json.dumps(row["FAIL_TO_PASS"]), "PASS_TO_PASS": json.dumps(row["PASS_TO_PASS"])})
    rows[1]["problem_statement"] = None
    datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "ds"))

    loaded = load_tasks(tmp_path / "ds")
    assert [t.instance_id for t in loaded.tasks] == [rows[0]["instance_id"], rows[2]["instance_id"]]
    assert [(e.row, e.field) for e in loaded.errors] == [(2, "problem_statement")]
    task = loaded.tasks[0]
    assert task.split == "test" and task.FAIL_TO_PASS == BUNDLED[0].FAIL_TO_PASS
    assert task.environment.kind == "image" and task.environment.image.startswith("swebench/sweb.eval.x86_64.")
    assert load_tasks(tmp_path / "ds", split="test").tasks and not load_tasks(tmp_path / "ds", split="train").tasks


def test_hub_name_offline_fails_clearly(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(TaskSetError, match="HF_DATASETS_OFFLINE"):
        load_tasks("princeton-nlp/SWE-bench_Lite", split="test")


def test_missing_file_and_unknown_directory(tmp_path):
    with pytest.raises(TaskSetError, match="does not exist"):
        load_tasks(tmp_path / "nope.jsonl")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TaskSetError, match="holds no task set"):
        load_tasks(tmp_path / "empty")


def _harbor_task(root: Path, name: str, dockerfile: bool = True) -> Path:
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "solution").mkdir()
    (task / "instruction.md").write_text(f"Fix the failing parser in /app ({name}).\n")
    (task / "task.toml").write_text(
        'version = "1.0"\n\n[metadata]\nauthor_name = "A"\ndifficulty = "hard"\ncategory = "debugging"\n'
        'tags = ["python"]\n\n[verifier]\ntimeout_sec = 120.0\n\n[agent]\ntimeout_sec = 600.0\n\n'
        '[environment]\nbuild_timeout_sec = 600.0\ncpus = 1\nmemory_mb = 2048\n'
    )
    if dockerfile:
        (task / "environment" / "Dockerfile").write_text("FROM debian:bookworm\nWORKDIR /app\nCOPY . .\nWORKDIR src\n")
    (task / "tests" / "test.sh").write_text("#!/bin/bash\npytest /tests/test_outputs.py && echo 1 > /logs/verifier/reward.txt\n")
    (task / "tests" / "test_outputs.py").write_text("def test_ok():\n    assert True\n")
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\necho fixed\n")
    return task


def test_harbor_directories_map_onto_tasks_graded_by_their_test_sh(tmp_path):
    root = tmp_path / "my-dataset"
    good = _harbor_task(root, "fix-parser")
    _harbor_task(root, "no-dockerfile", dockerfile=False)

    # The grading recipe travels with the task (lego/verify/harbor_grading.py runs it) ...
    row = harbor_task_row(good)
    assert row["instance_id"] == "fix-parser" and row["repo"] == "harbor/my-dataset" and row["difficulty"] == "hard"
    assert row["problem_statement"].startswith("Fix the failing parser")
    assert row["environment"]["kind"] == "dockerfile" and row["environment"]["workdir"] == "/app/src"
    assert Path(row["environment"]["dockerfile_dir"], "Dockerfile").is_file()
    assert row["base_commit"].startswith("harbor-env-") and row["test_command"] == "bash /tests/test.sh"
    harbor = row["provenance"]["harbor"]
    assert Path(harbor["tests_dir"], "test.sh").is_file() and harbor["verifier_timeout_s"] == 120.0
    assert harbor["reward_file"] == "/logs/verifier/reward.txt" and harbor["solution"].endswith("solve.sh")
    # ... and a task's identity follows its environment's content.
    assert harbor_task_row(good)["base_commit"] == row["base_commit"]

    # It loads without FAIL_TO_PASS (its test.sh grades it); a directory without a Dockerfile does not.
    loaded = load_tasks(root)
    assert [task.instance_id for task in loaded.tasks] == ["fix-parser"]
    assert [(e.row, e.field) for e in loaded.errors] == [(2, "environment/Dockerfile")]
    with pytest.raises(TaskSetError, match="row 2: environment/Dockerfile"):
        load_tasks(root, strict=True)
    # A row that only claims to be Harbor's, with no tests directory to run, is still refused.
    claimed = {**row, "provenance": {"source": "harbor", "harbor": {"task_dir": str(good)}}}
    refused = _write_jsonl(tmp_path / "claimed.jsonl", [claimed])
    errors = load_tasks(refused).errors
    assert [(e.row, e.field) for e in errors] == [(1, "FAIL_TO_PASS")]
    assert "names no tests directory" in errors[0].reason and "empty patch" in errors[0].reason


def test_a_row_without_fail_to_pass_is_refused(tmp_path):
    rows = _raw_rows()
    no_tests = {**rows[1], "FAIL_TO_PASS": [], "PASS_TO_PASS": []}  # SWE-bench rows with empty lists
    no_f2p = {**rows[2], "FAIL_TO_PASS": "[]"}  # as the public datasets store them
    missing = {k: v for k, v in rows[3].items() if k != "FAIL_TO_PASS"}
    blank = {**rows[4], "FAIL_TO_PASS": [" "]}
    path = _write_jsonl(tmp_path / "tasks.jsonl", [rows[0], no_tests, no_f2p, missing, blank, rows[5]])

    loaded = load_tasks(path)
    assert [t.instance_id for t in loaded.tasks] == [rows[0]["instance_id"], rows[5]["instance_id"]]
    assert [(e.row, e.field) for e in loaded.errors] == [(n, "FAIL_TO_PASS") for n in (2, 3, 4, 5)]
    for error, row in zip(loaded.errors, (no_tests, no_f2p, missing, blank), strict=True):
        assert f"task {row['instance_id']!r} in {path}" in error.reason, error.reason
        assert "no FAIL_TO_PASS test" in error.reason and "empty patch would resolve it" in error.reason
        assert "List the tests that fail at base_commit" in error.reason
    with pytest.raises(TaskSetError) as info:
        load_tasks(path, strict=True)
    message = str(info.value)
    assert "4 malformed row(s)" in message and str(path) in message
    assert all(f"row {n}: FAIL_TO_PASS: task " in message for n in (2, 3, 4, 5))
    # The CLI lists the refused rows (no rich markup in the reasons).
    from lego_cli import app

    result = CliRunner().invoke(app, ["tasks", "list", "--split", "all", f"tasks.source={path}"])
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())  # rich wraps long lines
    assert "4 malformed row(s) skipped" in output and output.count("has no FAIL_TO_PASS test") == 4


def test_a_parquet_row_without_fail_to_pass_is_refused(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = _raw_rows()[:3]
    for row in rows:
        row["FAIL_TO_PASS"] = json.dumps(row["FAIL_TO_PASS"])
        row["PASS_TO_PASS"] = json.dumps(row["PASS_TO_PASS"])
        row["environment"] = json.dumps(row["environment"])
        row["provenance"] = json.dumps(row["provenance"])
    rows[1]["FAIL_TO_PASS"] = "[]"
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "tasks.parquet")

    loaded = load_tasks(tmp_path / "tasks.parquet", split="all")
    assert len(loaded.tasks) == 2
    assert [(e.row, e.field) for e in loaded.errors] == [(2, "FAIL_TO_PASS")]
    assert f"task {rows[1]['instance_id']!r} in {tmp_path / 'tasks.parquet'} has no FAIL_TO_PASS test" \
        in loaded.errors[0].reason
    with pytest.raises(TaskSetError, match="row 2: FAIL_TO_PASS"):
        load_tasks(tmp_path / "tasks.parquet", strict=True)


def test_a_task_without_fail_to_pass_cannot_be_built():
    from pydantic import ValidationError

    from lego.tasksets.task import Task

    with pytest.raises(ValidationError, match="task 'x' has no FAIL_TO_PASS test"):
        Task(instance_id="x", repo="r", base_commit="b", problem_statement="p")
    with pytest.raises(ValidationError, match="no FAIL_TO_PASS test"):
        Task.model_validate_json(BUNDLED[0].model_copy(update={"FAIL_TO_PASS": []}).model_dump_json())


def test_cli_tasks_list():
    from lego_cli import app

    result = CliRunner().invoke(app, ["tasks", "list", "--split", "eval", "-c", "test"])  # test: no tasks.limit
    assert result.exit_code == 0, result.output
    for task in BUNDLED:
        if task.split == "eval":
            assert task.instance_id in result.output


# ---------------------------------------------------------------- synthesis

CALC = '''
def clamp(value, low, high):
    if value < low:
        return low
    if value > high:
        return high
    return value


def mean(values):
    if not values:
        raise ValueError("mean of nothing")
    return sum(values) / len(values)
'''

CALC_TESTS = '''
import pytest

from calc import clamp, mean


def test_clamp_inside():
    assert clamp(5, 0, 10) == 5


def test_clamp_low():
    assert clamp(-3, 0, 10) == 0


def test_clamp_high():
    assert clamp(42, 0, 10) == 10


def test_mean():
    assert mean([1, 2, 3, 6]) == 3


def test_mean_empty():
    with pytest.raises(ValueError):
        mean([])
'''


def test_synth_on_a_small_package(tmp_path):
    package = tmp_path / "calc-pkg"
    (package / "calc").mkdir(parents=True)
    (package / "tests").mkdir()
    (package / "calc" / "__init__.py").write_text(CALC)
    (package / "tests" / "test_calc.py").write_text(CALC_TESTS)
    (package / "conftest.py").write_text("")
    (package / "pyproject.toml").write_text('[project]\nname = "calc"\nversion = "1.2"\n')
    calls = []

    def counting_runner(repo_dir, test_ids=None):
        calls.append(test_ids)
        return run_tests(repo_dir, test_ids)

    report = synthesize(package, out_dir=tmp_path / "out", max_tasks=2, max_candidates=8, seed=3,
                        p2p_sample=2, runner=counting_runner)
    assert calls, "the runner seam was not used"
    assert 1 <= len(report.tasks) <= 2
    loaded = load_tasks(tmp_path / "out" / "tasks.jsonl")
    assert not loaded.errors and [t.instance_id for t in loaded.tasks] == [t.instance_id for t in report.tasks]
    for task in loaded.tasks:
        prov = task.provenance
        assert prov["package"] == "calc" and prov["version"] == "1.2" and prov["seed"] == 3
        assert prov["file"] == "calc/__init__.py" and prov["function"] in ("clamp", "mean") and prov["operator"]
        assert task.FAIL_TO_PASS and len(task.PASS_TO_PASS) <= 2
        assert task.FAIL_TO_PASS[0].split("::")[1] in task.problem_statement
        assert prov["original"] not in task.problem_statement or prov["original"].strip() in ("0", "1")
        # base_commit is the mutated commit on top of the pristine one; the gold patch restores it.
        repo = clone(task.environment.bundle, tmp_path / task.instance_id, task.base_commit)
        assert git(repo, "rev-parse", "HEAD~1").strip() == prov["pristine_commit"]
        apply_patch(repo, task.patch)
        assert subprocess.run(["git", "diff", "--quiet", prov["pristine_commit"]], cwd=repo).returncode == 0
