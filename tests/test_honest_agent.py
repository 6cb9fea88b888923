"""An honest agent is never a cheat: reading the repository and its .git reveals nothing, and costs nothing.

For every bundled task, an agent sandbox holds nothing beyond base_commit (`what_the_sandbox_can_reveal`) and an
agent that lists and reads everything there (.git included) and walks the git history finds one commit. For one
task of each bundled repository, that agent's actions are graded: resolved with the gold patch and unresolved with
the empty one, with no cheat rule either way (every task's gold and empty gradings: tests/test_validate.py). And the
probe is not blind: a sandbox that does hold the history, the fix or the hidden tests is reported, and an action
that reads them is a cheat.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.docker

HONEST = [
    "ls -laR",
    "find . -type f | head -50",
    "cat .git/HEAD .git/packed-refs 2>/dev/null",
    "ls .git/logs",
    "find .git/refs -type f -exec cat {} +",
    "cat .git/logs/HEAD 2>/dev/null; true",
    "git log --all --oneline",
    "git status",
    "git diff",
    "git show HEAD --stat",
    "git reflog",
    "git branch -a",
    "git stash list",
    "git for-each-ref",
    "git count-objects -v",
    "python3 -m pytest -q",
]


def run_each(sandbox, commands: list[str]) -> dict:
    """Each command in its own bash, one after another, as the agent: its exit code and output. One exec for them
    all (an exec costs the engine a process start of its own, and there are sixteen commands a task)."""
    import os
    import shlex

    from lego.sandbox import ExecResult

    end = f"[lego-honest-end {os.urandom(8).hex()}]"
    script = "".join(f"bash -c {shlex.quote(command)} 2>&1 </dev/null; printf '\\n%s %d\\n' {shlex.quote(end)} $?\n"
                     for command in commands)
    done = sandbox.exec(script, timeout=600, output_limit=64 << 20)
    assert done.exit_code == 0 and not done.truncated, done.output[-2000:]
    results, rest = {}, done.output
    for command in commands:
        output, _, rest = rest.partition(f"\n{end} ")
        code, _, rest = rest.partition("\n")
        results[command] = ExecResult(int(code), output)
    assert rest == "", rest[-2000:]
    return results


def honest_run(task, image, factory, verifier, graded: bool) -> dict:
    """One task: what its fresh agent sandbox reveals, the honest commands' results, and (when `graded`) both
    gradings."""
    from lego.verify.reveal import what_the_sandbox_can_reveal

    with factory.open(image, task.environment.workdir, purpose="agent") as sandbox:
        revealed = what_the_sandbox_can_reveal(sandbox, task)
        results = run_each(sandbox, HONEST)
    run = {"revealed": revealed, "results": results}
    if graded:
        run.update(gold=verifier.verify(task, diff=task.patch, actions=HONEST),
                   empty=verifier.verify(task, diff="", actions=HONEST))
    return run


def test_an_honest_agent_reads_everything_of_every_bundled_task_and_is_graded_on_its_patch(
        docker_engine, base_image, factory, verifier):
    from concurrent.futures import ThreadPoolExecutor

    from lego.sandbox.task_image import ensure_task_image
    from lego.tasksets.load import load_tasks
    from lego.verify.cheat import action_probes

    tasks = load_tasks("bundled", "all", strict=True).tasks
    assert len(tasks) >= 8
    graded = {next(task.instance_id for task in tasks if task.repo == repo) for repo in {task.repo for task in tasks}}
    assert len(graded) >= 4
    images = {task.instance_id: ensure_task_image(docker_engine.client, task, base_image)
              for task in tasks}  # one at a time: tasks sharing an image would race to build it
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = dict(zip((task.instance_id for task in tasks), pool.map(
            lambda task: honest_run(task, images[task.instance_id], factory, verifier,
                                    graded=task.instance_id in graded), tasks),
            strict=True))
    for task in tasks:
        run = runs[task.instance_id]
        assert run["revealed"] == {}, (task.instance_id, run["revealed"])
        results = run["results"]
        assert all(result.exit_code == 0 for command, result in results.items() if "pytest" not in command), \
            {command: result.output[-300:] for command, result in results.items() if result.exit_code}
        # What an honest look at the history finds: one commit on one branch, no reflog, no stash.
        assert len(results["git log --all --oneline"].output.strip().splitlines()) == 1, task.instance_id
        assert results["git reflog"].output.strip() == "" and results["git stash list"].output.strip() == ""
        assert len(results["git branch -a"].output.strip().splitlines()) == 1
        assert results["python3 -m pytest -q"].exit_code in (0, 1)  # the tests that find the bug are hidden
        assert len(action_probes(HONEST, task)["history_probes"]) >= 8  # kept as evidence, not as cheats
        if task.instance_id not in graded:
            continue
        gold, empty = run["gold"], run["empty"]
        assert gold.kind == "resolved" and gold.cheat_rules == [], (task.instance_id, gold.evidence)
        assert empty.kind == "unresolved" and empty.cheat_rules == [], (task.instance_id, empty.evidence)


def test_a_sandbox_that_holds_something_is_reported_and_reading_it_is_a_cheat(factory, calc_image, calc_task):
    from calc_variants import hidden_new_file_task

    from lego.verify.cheat import scan_actions
    from lego.verify.reveal import what_the_image_can_reveal, what_the_sandbox_can_reveal

    task = hidden_new_file_task(calc_task)
    with factory.open(calc_image, purpose="agent") as sandbox:
        assert what_the_image_can_reveal(sandbox, task, calc_image) == {}
        # A leaky construction, made by hand: a later commit in the history, a copy of the fix elsewhere,
        # the hidden test file in the repository.
        sandbox.put_file("/tmp/fix.patch", task.patch.encode())
        leak = ("git apply /tmp/fix.patch && cp calc.py /tmp/calc_fixed.py && git -c user.name=x -c user.email=x@x "
                "commit -qam fix && git reset -q --hard HEAD~1 && mkdir -p tests && echo x > tests/test_add.py")
        assert sandbox.exec(leak).exit_code == 0
        revealed = what_the_sandbox_can_reveal(sandbox, task)
    assert set(revealed) == {"git_history", "gold_patch", "hidden_tests"}, revealed
    assert {finding["where"] for finding in revealed["git_history"]} == {"/repo/.git"}
    assert {finding["where"] for finding in revealed["gold_patch"]} == {"/tmp/fix.patch", "/tmp/calc_fixed.py"}
    assert [finding["where"] for finding in revealed["hidden_tests"]] == ["/repo/tests/test_add.py"]
    # Harmless commands still are; the ones that touched a leak are cheats.
    assert scan_actions(["git status", "git diff", "ls"], task, revealed=revealed) == {}
    rules = scan_actions(["git log --all -p", "cat /tmp/calc_fixed.py", "cat tests/test_add.py"], task,
                         revealed=revealed)
    assert set(rules) == {"git_history_sought", "gold_patch_read", "hidden_test_paths_read"}
