"""The warm start's demonstrations edit lines by number (`line_edit_command`) where a patch only edits lines: the
same change as `git apply`, byte for byte, in a fraction of the tokens a policy must learn and sample."""

import subprocess

import pytest

from lego.harness.base import apply_patch_command, line_edit_command
from lego.pipeline.attempts import gold_command
from lego.tasksets.gitutil import clone, git
from lego.tasksets.load import load_tasks

BUNDLED = [*load_tasks("bundled", "train").tasks, *load_tasks("bundled", "eval").tasks]


def edited(tmp_path, task, command: str) -> str:
    repo = clone(task.environment.bundle, tmp_path / "by-command", task.base_commit)
    done = subprocess.run(["bash"], input=command, cwd=repo, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return git(repo, "diff")


@pytest.mark.parametrize("task", BUNDLED, ids=lambda task: task.instance_id)
def test_the_line_edits_make_the_gold_patchs_change_exactly(tmp_path, task):
    command = line_edit_command(task.patch)
    assert command is not None and command == gold_command(task)
    applied = clone(task.environment.bundle, tmp_path / "applied", task.base_commit)
    subprocess.run(["git", "apply", "-"], input=task.patch, text=True, cwd=applied, check=True)
    assert edited(tmp_path, task, command) == git(applied, "diff")
    assert len(command) < len(apply_patch_command(task.patch))  # only the written lines, no context


def test_every_shape_of_edit_survives_sed_and_the_shell(tmp_path):
    """Changes, deletions, insertions at the top, in the middle and past the last line; empty lines, quotes,
    backslashes, leading blanks and sed's own characters in the written text."""
    repo = tmp_path / "repo"
    repo.mkdir()
    original = "".join(f"line {n}\n" for n in range(1, 21))
    (repo / "a.py").write_text(original)
    (repo / "b.txt").write_text("only\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    lines = original.splitlines(keepends=True)
    lines[0:0] = ["# top\n"]
    lines[5:7] = ["    it's a \\ back\\slash & /slash/\n", "\n", "\t'quoted' \"twice\"\n"]
    del lines[12]
    lines.extend(["", "tail $HOME `x`\n", "\\\n"])
    (repo / "a.py").write_text("".join(lines))
    (repo / "b.txt").write_text("only\nsecond\n")
    patch = git(repo, "diff", "-U1")
    target = git(repo, "diff")
    git(repo, "checkout", "-q", ".")
    command = line_edit_command(patch)
    assert command is not None
    done = subprocess.run(["bash"], input=command, cwd=repo, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert git(repo, "diff") == target


@pytest.mark.parametrize("patch", [
    "diff --git a/new.py b/new.py\nnew file mode 100644\n--- /dev/null\n+++ b/new.py\n@@ -0,0 +1 @@\n+x\n",
    "diff --git a/a.py b/a.py\n--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-x\n+y\n\\ No newline at end of file\n",
    "diff --git a/a.py b/c.py\nsimilarity index 90%\nrename from a.py\nrename to c.py\n",
    "",
])
def test_what_is_more_than_a_line_edit_is_left_to_git_apply(patch):
    assert line_edit_command(patch) is None
