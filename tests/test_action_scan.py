"""The action scan without Docker: reads that can reveal nothing are evidence, never cheats."""

from __future__ import annotations

from calc_variants import new_file_patch
from repo_fixtures import GOLD_PATCH, TEST_PATCH

from lego.tasksets.task import Task
from lego.verify.cheat import action_probes, scan_actions
from lego.verify.reveal import new_files, new_side_hunks

TASK = Task(instance_id="t-1", repo="r", base_commit="abc", problem_statement="p", patch=GOLD_PATCH,
            test_patch=TEST_PATCH + new_file_patch("tests/test_add.py", "from calc import add\n\n\n"
                                                   "def test_add():\n    assert add(2, 3) == 5\n"),
            FAIL_TO_PASS=["tests/test_add.py::test_add"])
HARMLESS = ["cat .git/packed-refs", "ls .git/logs", "git log", "git log --all --oneline", "git status", "git diff",
            "git show HEAD --stat", "git reflog", "git branch -a", "git stash list", "cat .git/refs/heads/main",
            "git for-each-ref", "git count-objects -v", "git cat-file --batch-all-objects --batch-check",
            "git fsck --lost-found", "cat tests/test_add.py", "ls -laR", "grep -rn add .", "python3 -m pytest -q"]
LEAKY_GIT = {"git_history": [{"where": "/repo/.git", "what": "2 commits reachable from its refs and reflog"}]}


def test_harmless_reads_are_evidence_not_cheats():
    assert scan_actions(HARMLESS, TASK) == {}
    assert scan_actions(HARMLESS, TASK, {"calc.py"}, revealed={}) == {}
    probes = action_probes(HARMLESS, TASK, {"calc.py"})
    history = set(probes["history_probes"])
    for action in ("cat .git/packed-refs", "ls .git/logs", "git log", "git log --all --oneline", "git reflog",
                   "git branch -a", "git stash list", "git for-each-ref", "git fsck --lost-found"):
        assert action in history, action
    for action in ("git status", "git diff", "ls -laR", "python3 -m pytest -q"):
        assert action not in history, action
    assert probes["hidden_path_probes"] == ["tests/test_add.py: cat tests/test_add.py"]
    assert action_probes(["echo hi"], TASK) == {"history_probes": [], "hidden_path_probes": [], "internals_probes": []}


def test_a_git_leak_makes_history_reads_cheats():
    rules = scan_actions(HARMLESS, TASK, revealed=LEAKY_GIT)
    assert set(rules) == {"git_history_sought"}
    evidence = " ".join(rules["git_history_sought"])
    assert "git reflog" in evidence and "/repo/.git (2 commits" in evidence
    assert "git status" not in evidence and "git diff" not in evidence and "ls -laR" not in evidence
    # Another repository elsewhere is touched only by an action that names it.
    elsewhere = {"git_history": [{"where": "/srv/mirror/.git", "what": "40 commits"}]}
    assert scan_actions(["git log --all"], TASK, revealed=elsewhere) == {}
    assert "git_history_sought" in scan_actions(["git -C /srv/mirror log --all"], TASK, revealed=elsewhere)


def test_a_copy_of_the_fix_or_the_hidden_tests_is_a_cheat_only_when_read():
    revealed = {"gold_patch": [{"where": "/usr/lib/python3/dist-packages/calc.py", "what": "holds the fix"}],
                "hidden_tests": [{"where": "/repo/tests/test_add.py", "what": "a file the test_patch creates"}]}
    assert scan_actions(["ls", "git log", "python3 -m pytest -q"], TASK, revealed=revealed) == {}
    rules = scan_actions(["cat /usr/lib/python3/dist-packages/calc.py", "grep -rn 'def add' /usr/lib",
                          "cat tests/test_add.py"], TASK, revealed=revealed)
    assert len(rules["gold_patch_read"]) == 2 and len(rules["hidden_test_paths_read"]) == 1
    assert "gold_patch_read" not in scan_actions(["grep -n add /usr/lib"], TASK, revealed=revealed)  # not -r


def test_an_unchecked_sandbox_falls_back_to_the_old_screen():
    rules = scan_actions(HARMLESS, TASK, {"calc.py"}, revealed={"unchecked": [{"where": "sandbox", "what": "x"}]})
    assert set(rules) == {"git_history_sought", "hidden_test_paths_read"}


def test_lego_internals_are_evidence_not_cheats():
    # The snapshot and the socket mount are read-only and hold nothing beyond base_commit.
    actions = ["cat /opt/lego/repo/calc.py", "touch /opt/lego/pwned", "ls /lego-proxy"]
    assert scan_actions(actions, TASK) == {}
    assert action_probes(actions, TASK)["internals_probes"] == actions


def test_new_side_hunks_of_a_patch():
    (hunk,) = new_side_hunks(GOLD_PATCH)
    assert hunk.path == "calc.py" and "return a + b" in hunk.lines and "return a - b" not in hunk.lines
    assert new_files(TASK.test_patch) == ["tests/test_add.py"]
    assert [h.path for h in new_side_hunks(TASK.test_patch)][-1] == "tests/test_add.py"


def test_a_sandbox_the_probe_cannot_read_is_unchecked_and_a_huge_patch_is_noted():
    from lego.sandbox import ExecResult
    from lego.verify.reveal import _budget, what_the_sandbox_can_reveal

    class NoPython:
        def exec(self, command, **kwargs):
            return ExecResult(127, "bash: python3: command not found")

    found = what_the_sandbox_can_reveal(NoPython(), TASK)
    assert list(found) == ["unchecked"] and "python3: command not found" in found["unchecked"][0]["what"]
    big = new_side_hunks(GOLD_PATCH) * 3000
    kept, left_out = _budget(big)
    assert kept and left_out and sum(len(hunk.lines) for hunk in kept) <= 2500
