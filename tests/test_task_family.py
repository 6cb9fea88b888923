"""The `family:constants` task family (lego/tasksets/family.py): seeded, split by surface, gradeable."""

from __future__ import annotations

import re
import subprocess
from types import SimpleNamespace

import pytest

from lego.tasksets.family import HELD_OUT_SPLIT, TRAIN_SPLIT, family_dir, family_tasks, gold_command
from lego.tasksets.gitutil import apply_patch, clone, diff, git
from lego.tasksets.load import TaskSetError, load_tasks
from lego.tasksets.testrun import PASSED, run_tests


@pytest.fixture(scope="module")
def family_cache(tmp_path_factory):
    """A machine cache of its own, holding the default family (64 training, 32 held-out tasks, seed 0)."""
    root = tmp_path_factory.mktemp("cache")
    family_dir("constants", 0, root=root / "tasksets" / "family")
    return root


@pytest.fixture(scope="module")
def tasks(family_cache):
    return family_tasks("constants", 0, root=family_cache / "tasksets" / "family")


def test_the_same_seed_gives_the_same_tasks_and_another_seed_others(tmp_path):
    first = (family_dir("constants", 7, 8, 8, root=tmp_path / "a") / "tasks.jsonl").read_bytes()
    again = (family_dir("constants", 7, 8, 8, root=tmp_path / "b") / "tasks.jsonl").read_bytes()
    other = (family_dir("constants", 8, 8, 8, root=tmp_path / "c") / "tasks.jsonl").read_bytes()
    assert first == again  # the same statements, patches and commit hashes, built from scratch twice
    assert first != other


def test_the_splits_have_their_sizes_and_share_no_surface(tasks):
    train = [t for t in tasks if t.split == TRAIN_SPLIT]
    held_out = [t for t in tasks if t.split == HELD_OUT_SPLIT]
    assert (len(train), len(held_out)) == (64, 32)
    assert len({t.instance_id for t in tasks}) == 96 and len({t.base_commit for t in tasks}) == 96
    assert len({t.provenance["module"] for t in tasks}) == 96  # a module per task: 96 independent file names

    def surface(split, key):
        return {t.provenance[key] for t in split}

    assert not surface(train, "module") & surface(held_out, "module")  # other files
    assert not surface(train, "function") & surface(held_out, "function")  # other function names
    assert not surface(train, "value") & surface(held_out, "value")  # other values
    train_lines = {line[1:] for t in train for line in t.patch.splitlines()}
    for task in held_out:  # no held-out fix is a line any training patch holds
        (fixed,) = [line for line in task.patch.splitlines() if line.startswith("+ ")]
        assert fixed[1:] not in train_lines


def test_the_statement_names_the_module_the_function_and_the_value(tasks):
    phrasings = set()
    for task in tasks:
        facts = task.provenance
        statement = task.problem_statement
        assert f"`appconf/{facts['module']}.py`" in statement
        assert f"`def {facts['function']}(" in statement
        assert re.search(rf"`return [^`]*\b{facts['value']}\)?`", statement)
        assert not re.search(rf"\b{facts['wrong_value']}\b", statement)
        assert task.patch.count("\n+    ") == 1 and f"appconf/{facts['module']}.py" in task.patch
        phrasings.add(statement.split("`")[0])
    assert len(phrasings) >= 3


def test_load_tasks_serves_the_family_by_split_from_the_cache(family_cache, monkeypatch):
    monkeypatch.setenv("LEGO_CACHE_DIR", str(family_cache))
    train = load_tasks("family:constants", "train", strict=True)
    held_out = load_tasks("family:constants", "eval", strict=True)
    assert (len(train), len(held_out)) == (64, 32) and not train.errors
    assert all(t.environment.bundle and t.environment.bundle.startswith("/") for t in train.tasks)
    assert len(load_tasks("family:constants:3", "all", strict=True)) == 96  # another seed is another set
    with pytest.raises(TaskSetError, match="family:constants"):
        load_tasks("family:nonsense", "train")
    with pytest.raises(TaskSetError, match="integer"):
        load_tasks("family:constants:x", "train")
    # sizes after the seed: a bigger draw of the same family, with its own held-out modules
    sized = load_tasks("family:constants:3:12+20", "all", strict=True)
    assert sum(t.split == "train" for t in sized.tasks) == 12 and sum(t.split == "eval" for t in sized.tasks) == 20
    for malformed in ("family:constants:3:12", "family:constants:3:12+x", "family:constants:3:+20"):
        with pytest.raises(TaskSetError, match=r"<train>\+<held_out>"):
            load_tasks(malformed, "train")
    with pytest.raises(TaskSetError, match="at most 320 tasks"):
        load_tasks("family:constants:3:300+30", "train")


def _named(statement: str) -> tuple[str, str, str]:
    """What a statement names: the file, the function (its `def`), the right return line."""
    (path,) = set(re.findall(r"appconf/\w+\.py", statement))
    (function,) = re.findall(r"`def (\w+)\(", statement)
    (body,) = re.findall(r"`(return [^`]+)`", statement)
    return path, function, body


def test_the_gold_command_is_written_from_the_statement_alone(tasks):
    for task in tasks:
        command, statement = task.provenance["gold_command"], task.problem_statement
        path, function, body = _named(statement)
        assert (path, function) == (f"appconf/{task.provenance['module']}.py", task.provenance["function"])
        assert str(task.provenance["value"]) in body
        assert command == gold_command(path, function, body)  # a function of what the statement says, nothing else
        words = set(re.findall(r"\w+", command))
        syntax = {"sed", "i", "def", "retu", "s", "git", "diff"}  # the command's own, the same for every task
        assert words - syntax <= set(re.findall(r"\w+", statement)), (task.instance_id, words - syntax)
        assert str(task.provenance["wrong_value"]) not in words


def test_the_gold_command_makes_exactly_the_gold_patch_in_every_task(tasks, tmp_path):
    """Run in the task's repository at base_commit, each command leaves exactly the gold patch's tree: the diff
    against base_commit is the gold patch, byte for byte (one host clone, no Docker)."""
    repo = clone(tasks[0].environment.bundle, tmp_path / "constants")
    for task in tasks:
        git(repo, "checkout", "-q", "-f", "--detach", task.base_commit)
        subprocess.run(["bash", "-c", task.provenance["gold_command"]], cwd=repo, check=True, capture_output=True)
        assert diff(repo) == task.patch, task.instance_id


def test_gold_engines_demonstrate_a_family_task_by_its_command_and_another_by_its_patchs_line_edits(tasks, monkeypatch):
    import lego.engine.tokenizer
    from lego.harness.base import get_harness, line_edit_command
    from lego.pipeline.attempts import gold_engines

    monkeypatch.setattr(lego.engine.tokenizer, "load_tokenizer",
                        lambda: SimpleNamespace(convert_tokens_to_ids=lambda token: 0))
    config = SimpleNamespace(harness=SimpleNamespace(name="mini-swe-agent"))
    engine_for, adapter = gold_engines(config, scorer=None), get_harness("mini-swe-agent")
    family = tasks[-1]
    assert engine_for(family).script == adapter.gold_replies(family.provenance["gold_command"])
    bundled = load_tasks("bundled", "all").tasks[0]
    assert "gold_command" not in bundled.provenance
    assert engine_for(bundled).script == adapter.gold_replies(line_edit_command(bundled.patch))


def _statuses(task, tmp_path, patch: str) -> dict[str, str]:
    repo = clone(task.environment.bundle, tmp_path / f"{task.instance_id}-{len(patch)}", task.base_commit)
    apply_patch(repo, task.test_patch)
    apply_patch(repo, patch)
    return run_tests(repo, [*task.FAIL_TO_PASS, *task.PASS_TO_PASS], timeout_s=120)


def test_gold_resolves_and_the_empty_patch_does_not_in_a_host_clone(tasks, tmp_path):
    picked = [tasks[0], tasks[1], *[t for t in tasks if t.split == HELD_OUT_SPLIT][:2]]
    for task in picked:
        empty = _statuses(task, tmp_path, "")
        assert all(empty[t] != PASSED for t in task.FAIL_TO_PASS), (task.instance_id, empty)
        assert all(empty[t] == PASSED for t in task.PASS_TO_PASS), (task.instance_id, empty)
        gold = _statuses(task, tmp_path, task.patch)
        assert all(gold[t] == PASSED for t in [*task.FAIL_TO_PASS, *task.PASS_TO_PASS]), (task.instance_id, gold)


@pytest.mark.docker
def test_the_verifier_resolves_gold_and_not_the_empty_patch(verifier, tasks):
    from lego.verify.validate import validate_tasks

    picked = [tasks[0], [t for t in tasks if t.split == HELD_OUT_SPLIT][0]]
    report = validate_tasks(verifier, picked, runs=1, concurrency=2)
    for result in report.tasks:
        assert result.gold == ["resolved"], (result.instance_id, result.evidence)
        assert result.empty == ["unresolved"], (result.instance_id, result.evidence)
    assert report.broken == []
