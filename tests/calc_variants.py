"""Variants of the calc task (same repository and base commit, so the same image) for red-team and fault tests."""

from __future__ import annotations

from lego.tasksets.task import Task


def new_file_patch(path: str, text: str) -> str:
    lines = text.splitlines()
    body = "".join(f"+{line}\n" for line in lines)
    return (f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
            f"@@ -0,0 +1,{len(lines)} @@\n{body}")


def with_new_test_file(task: Task, path: str, source: str, test_name: str) -> Task:
    """The task whose hidden test_patch creates `path` (FAIL_TO_PASS: `path::test_name`)."""
    return task.model_copy(update={
        "instance_id": f"{task.instance_id}-{test_name}",
        "test_patch": new_file_patch(path, source),
        "FAIL_TO_PASS": [f"{path}::{test_name}"],
        "PASS_TO_PASS": ["tests/test_calc.py::test_mul"],
    })


def hidden_new_file_task(task: Task) -> Task:
    """The hidden test is a new file, tests/test_add.py (an agent could try to write it first)."""
    return with_new_test_file(task, "tests/test_add.py",
                              "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n", "test_add")


def slow_task(task: Task, seconds: float) -> Task:
    """The hidden test sleeps before checking add: time to kill its container, or to time out."""
    source = (f"import time\n\nfrom calc import add\n\n\ndef test_add_slowly():\n    time.sleep({seconds})\n"
              "    assert add(2, 3) == 5\n")
    return with_new_test_file(task, "tests/test_slow.py", source, "test_add_slowly")


def memory_hog_task(task: Task, megabytes: int) -> Task:
    """The hidden test writes `megabytes` of memory (pages touched, so the cgroup's limit bites)."""
    source = (f"from calc import add\n\n\ndef test_add_with_a_big_buffer():\n"
              f"    buffer = b'x' * ({megabytes} << 20)\n    assert add(2, 3) == 5 and len(buffer)\n")
    return with_new_test_file(task, "tests/test_memory.py", source, "test_add_with_a_big_buffer")

