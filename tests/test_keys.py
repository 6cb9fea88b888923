"""Stage code versions follow what each stage imports (lego.pipeline.keys), on copies of the source tree."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lego import REPO_ROOT
from lego.pipeline.keys import STAGE_MODULES, CodeKeyError, code_version, stage_code_version, stage_files

IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of lego/ and sql/ that a test may edit."""
    root = tmp_path / "repo"
    shutil.copytree(REPO_ROOT / "lego", root / "lego", ignore=IGNORED)
    shutil.copytree(REPO_ROOT / "sql", root / "sql", ignore=IGNORED)
    return root


def touch(root: Path, relative: str, text: str = "\n# edited\n") -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        handle.write(text)


def changed_by(root: Path, stage: str, relative: str, text: str = "\n# edited\n") -> bool:
    before = stage_code_version(stage, root)
    touch(root, relative, text)
    return stage_code_version(stage, root) != before


def test_rollout_runs_the_records_writer_and_config():
    files = stage_files("rollout")
    for needed in ("lego/records.py", "lego/data/writer.py", "lego/config.py", "lego/rollout/attempt.py", "lego/rollout/batch.py",
                   "lego/pipeline/rollout_stage.py", "lego/pipeline/attempts.py", "lego/pipeline/__init__.py",
                   "lego/__init__.py", "lego/harness/mini_swe_agent.py",  # named by string in the registry
                   "lego/harness/runners/mini_swe_agent_runner.py",  # its RUNTIME_FILES
                   "lego/harness/runners/docker_shell.py"):
        assert needed in files, needed
    assert files == sorted(files) and all(not f.startswith("/") for f in files)


@pytest.mark.parametrize("stage", ["verify", "filter", "evaluate"])
def test_grading_stages_count_the_mounted_runner(stage):
    files = stage_files(stage)
    runner = sorted(p.relative_to(REPO_ROOT).as_posix() for p in (REPO_ROOT / "lego/verify/runner").rglob("*.py"))
    assert runner and set(runner) <= set(files)
    assert not any("__pycache__" in f for f in files)


@pytest.mark.parametrize(("stage", "inside", "outside"), [
    ("taskset", "lego/tasksets/load.py", "lego/rollout/attempt.py"),
    ("filter", "lego/verify/cheat.py", "lego/train/trainer.py"),
    ("rollout", "lego/records.py", "lego/pipeline/verify_stage.py"),
    ("rollout", "lego/data/writer.py", "lego/evaluate/report.py"),
    ("rollout", "lego/config.py", "lego/train/trainer.py"),
    ("verify", "lego/verify/grader.py", "lego/train/trainer.py"),
    ("dataset", "sql/advantages.sql", "lego/train/trainer.py"),
    ("train", "lego/train/trainer.py", "lego/pipeline/evaluate_stage.py"),
    ("evaluate", "lego/evaluate/report.py", "lego/train/trainer.py"),
])
def test_editing_an_imported_file_changes_the_key_and_an_unrelated_one_does_not(tree, stage, inside, outside):
    assert inside in stage_files(stage, tree) and outside not in stage_files(stage, tree)
    assert not changed_by(tree, stage, outside)
    assert changed_by(tree, stage, inside)


# What each stage runs, by package. A stage's key must change when code it runs changes, and only then.
ALL_STAGES = frozenset(STAGE_MODULES)
EVALUATES = frozenset({"evaluate", "baseline"})  # lego.pipeline.evaluation: attempts at a policy, graded, summarized
# The stages that run attempts: the harness in a sandbox, its model calls through the proxy to an engine
# (lego.pipeline.attempts -> lego.rollout). The warm start runs gold attempts, the filter measures difficulty.
RUNS_ATTEMPTS = frozenset({"rollout", "warmstart", "filter"}) | EVALUATES
# The stages that grade attempts: lego.verify in a fresh sandbox (lego.pipeline.grading).
GRADES = frozenset({"verify", "warmstart", "filter"}) | EVALUATES
OPENS_THE_CATALOG = ALL_STAGES - {"taskset"}  # the taskset stage writes its task lists; every other reads records
TRAINS = frozenset({"train", "warmstart"})  # the RL step and the warm start's SFT, both through the Trainer
NONE: frozenset[str] = frozenset()

# file edited -> the stages whose key that edit changes (every other stage's key stays), why in the comment.
STAGES_RUNNING: dict[str, frozenset[str]] = {
    # the proxy, harnesses and rollout loop run attempts and nothing else: grading a stored attempt, building the
    # dataset or training from it runs none of them
    "lego/proxy/session.py": RUNS_ATTEMPTS,
    "lego/harness/openhands.py": RUNS_ATTEMPTS,  # named by string in the harness registry
    "lego/harness/runners/openhands_runner.py": RUNS_ATTEMPTS,  # mounted into the sandbox (RUNTIME_FILES)
    "lego/rollout/attempt.py": RUNS_ATTEMPTS,
    "lego/rollout/requests.py": RUNS_ATTEMPTS,  # rollout ids: which attempts exist
    # sampling engines serve the proxy; the trainer loads the checkpoint itself (lego.engine.checkpoint)
    "lego/engine/vllm_engine.py": RUNS_ATTEMPTS,
    "lego/engine/factory.py": RUNS_ATTEMPTS,
    "lego/engine/checkpoint.py": RUNS_ATTEMPTS | {"train"},  # a policy's version is read from its checkpoint
    # the sandbox runs attempts and grades them
    "lego/sandbox/docker_sandbox.py": RUNS_ATTEMPTS | GRADES,
    "lego/sandbox/image.py": RUNS_ATTEMPTS | GRADES,
    # the verifier grades: an attempt's trajectory does not depend on it
    "lego/verify/grader.py": GRADES,
    "lego/verify/runner/lego_grade.py": GRADES,  # mounted into the grading sandbox (RUNTIME_FILES)
    # records: every stage stores (the task lists included); every stage but taskset reads through the catalog
    "lego/records.py": ALL_STAGES,
    "lego/data/writer.py": ALL_STAGES,
    "lego/data/catalog.py": OPENS_THE_CATALOG,
    "lego/pipeline/stored.py": OPENS_THE_CATALOG,  # stored terminations and outcomes
    "lego/data/batches.py": TRAINS,  # training samples from stored segments
    "lego/data/export.py": NONE,  # `lego export`
    "lego/pipeline/attempts.py": RUNS_ATTEMPTS,
    "lego/pipeline/grading.py": GRADES,
    "lego/pipeline/runners.py": EVALUATES,  # evaluation wraps the real runner for the empty policy
    "lego/pipeline/diagnosis.py": NONE,  # `lego diagnose`
    "lego/train/trainer.py": TRAINS,
    "lego/train/sft.py": frozenset({"warmstart", "train"}),  # train: `train.adv_estimator: sft` fine-tunes
    "lego/tasksets/task.py": ALL_STAGES,  # every stage reads or writes tasks
    "lego/evaluate/report.py": EVALUATES,
    "lego/evaluate/compare.py": NONE,  # `lego compare`
    # the learning bench's report (paired statistics, tables, the failure split) reads what stages stored: editing
    # it must not rerun the hours of stages it reports on
    "lego/evaluate/paired.py": NONE,
    "lego/pipeline/learning.py": NONE,
    "lego/bench/learn.py": NONE,
    "lego/bench/failures.py": NONE,
    "lego/pipeline/evaluation_tracking.py": NONE,  # `lego eval` in MLflow: no stage's result depends on it
    "lego/track/traces.py": NONE,  # MLflow records what stages computed; no stage computes with it
    "lego/ui/app.py": NONE,
    "lego/bench/rollout.py": NONE,
}


def test_every_package_has_an_entry():
    packages = {path.parent.relative_to(REPO_ROOT).as_posix() for path in (REPO_ROOT / "lego").glob("*/__init__.py")}
    covered = {"/".join(path.split("/")[:2]) for path in STAGES_RUNNING}
    assert packages <= covered, sorted(packages - covered)


@pytest.mark.parametrize(("path", "stages"), STAGES_RUNNING.items(), ids=list(STAGES_RUNNING))
def test_an_edit_changes_the_keys_of_the_stages_that_run_it_and_no_other(tree, path, stages):
    before = {stage: stage_code_version(stage, tree) for stage in STAGE_MODULES}
    touch(tree, path)
    changed = {stage for stage in STAGE_MODULES if stage_code_version(stage, tree) != before[stage]}
    assert changed == set(stages), f"{path}: changed {sorted(changed)}, expected {sorted(stages)}"


def test_every_stage_keys_its_own_module(tree):
    for stage, module in STAGE_MODULES.items():
        assert changed_by(tree, stage, f"lego/pipeline/{module}.py")


def test_a_lazy_import_counts(tree):
    assert "lego/train/trainer.py" not in stage_files("verify", tree)
    touch(tree, "lego/verify/grader.py", "\n\ndef _probe():\n    from lego.train import trainer\n"
                                         "    from ..evaluate import stats\n    return trainer, stats\n")
    files = stage_files("verify", tree)
    assert {"lego/train/trainer.py", "lego/train/__init__.py", "lego/evaluate/stats.py"} <= set(files)
    assert changed_by(tree, "verify", "lego/train/trainer.py")


def test_a_module_named_by_string_counts(tree):
    touch(tree, "lego/probe_plugin.py", "VALUE = 1\n")
    assert "lego/probe_plugin.py" not in stage_files("taskset", tree)
    touch(tree, "lego/pipeline/taskset_stage.py", '\nPLUGINS = {"probe": "lego.probe_plugin:VALUE"}\n')
    assert "lego/probe_plugin.py" in stage_files("taskset", tree)
    assert changed_by(tree, "taskset", "lego/probe_plugin.py")


def test_a_sql_file_loaded_by_name_counts(tree):
    assert not any(f.startswith("sql/") for f in stage_files("taskset", tree))
    touch(tree, "sql/probe.sql", "SELECT {{ x }} AS x\n")
    touch(tree, "lego/pipeline/taskset_stage.py",
          '\n\ndef _probe():\n    from lego.data.sql import load_sql\n\n    return load_sql("probe", x=1)\n')
    files = stage_files("taskset", tree)
    assert "sql/probe.sql" in files and "lego/data/sql.py" in files
    assert "sql/advantages.sql" not in files
    assert not changed_by(tree, "taskset", "sql/advantages.sql")
    assert changed_by(tree, "taskset", "sql/probe.sql")


def test_a_computed_sql_name_counts_every_sql_file(tree):
    # the catalog loads its views by a loop variable: each of them counts for the stages that open it
    files = stage_files("dataset", tree)
    assert {f"sql/{p.name}" for p in (tree / "sql").glob("*.sql")} <= set(files)
    assert changed_by(tree, "dataset", "sql/comparisons.sql")


def test_runtime_files_count(tree):
    assert changed_by(tree, "verify", "lego/verify/runner/lego_grade.py")
    before = stage_code_version("verify", tree)
    touch(tree, "lego/verify/runner/new_helper.sh", "echo hi\n")  # any file under the declared directory
    assert stage_code_version("verify", tree) != before
    assert not changed_by(tree, "verify", "lego/verify/runner/__pycache__/x.cpython-312.pyc", "bytes")
    assert changed_by(tree, "rollout", "lego/harness/runners/openhands_runner.py")
    assert not changed_by(tree, "taskset", "lego/harness/runners/openhands_runner.py")


def test_runtime_files_must_be_readable_statically(tree):
    touch(tree, "lego/verify/cheat.py", '\nRUNTIME_FILES = ("no_such_dir",)\n')
    with pytest.raises(CodeKeyError, match="no_such_dir"):
        stage_files("verify", tree)
    touch(tree, "lego/verify/cheat.py", "\nRUNTIME_FILES = (some_function(),)\n")
    with pytest.raises(CodeKeyError, match="statically"):
        stage_files("verify", tree)


def test_keys_do_not_depend_on_where_the_tree_is(tree, tmp_path):
    other = tmp_path / "elsewhere" / "copy"
    shutil.copytree(tree, other)
    for stage in STAGE_MODULES:
        assert stage_code_version(stage, tree) == stage_code_version(stage, other)
        assert stage_files(stage, tree) == stage_files(stage, other)
    with pytest.raises(CodeKeyError, match="unknown stage"):
        stage_code_version("nonexistent", tree)


def test_code_version_is_computed_once_per_process(monkeypatch):
    from lego.pipeline import keys

    versions = {stage: code_version(stage) for stage in STAGE_MODULES}
    assert len(set(versions.values())) == len(versions)  # every stage runs different code

    def no_second_digest(*args, **kwargs):
        raise AssertionError("a stage's code version was computed twice in one process")

    monkeypatch.setattr(keys, "_digest", no_second_digest)
    assert {stage: code_version(stage) for stage in STAGE_MODULES} == versions
