"""Fault injection on the real Docker engine: what breaks under the verifier is infra_error, with the check
that names it, retried, with every attempt's failure kept, and no container left behind."""

from __future__ import annotations

import os
import threading
import time

import pytest
from calc_variants import memory_hog_task, slow_task
from repo_fixtures import GOLD_PATCH

pytestmark = pytest.mark.docker


@pytest.fixture(autouse=True)
def nothing_left_behind(docker_engine):
    yield
    from lego.sandbox.docker_sandbox import LABEL

    assert docker_engine.client.ping()
    mine = docker_engine.client.containers.list(all=True, filters={"label": [LABEL, f"lego.owner_pid={os.getpid()}"]})
    assert not mine, [container.name for container in mine]


def make_verifier(docker_engine, base_image, lego_config, retries: int = 1, timeout_s: float | None = None,
                  memory: str | None = None):
    from lego.verify import Verifier

    sandbox = lego_config.sandbox.model_copy(update={"memory": memory} if memory else {})
    verify = lego_config.verify.model_copy(update={"infra_retries": retries,
                                                   **({"timeout_s": timeout_s} if timeout_s else {})})
    return Verifier(docker_engine.client, base_image, sandbox, verify)


class KillWhileTestsRun(threading.Thread):
    """Kills the first `times` verify containers of this process once pytest runs in them."""

    def __init__(self, client, times: int):
        super().__init__(daemon=True)
        self.client, self.times = client, times
        self.killed: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        from docker.errors import APIError, NotFound

        from lego.sandbox.docker_sandbox import LABEL

        labels = [LABEL, f"lego.owner_pid={os.getpid()}", "lego.purpose=verify"]
        while len(self.killed) < self.times and not self.stop.is_set():
            for container in self.client.containers.list(filters={"label": labels}):
                if container.name in self.killed:
                    continue
                try:
                    # The grading runner's process (`ps` may cut the command line at 80 columns: its start is kept).
                    if any("python3 -I " in " ".join(process) for process in container.top()["Processes"]):
                        container.kill()
                        self.killed.append(container.name)
                except (APIError, NotFound):
                    pass
            time.sleep(0.1)

    def __enter__(self) -> KillWhileTestsRun:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.join(10)


def test_container_killed_mid_run_is_infra_and_the_retry_grades(docker_engine, base_image, lego_config, calc_task):
    verifier = make_verifier(docker_engine, base_image, lego_config, retries=1)
    task = slow_task(calc_task, seconds=3)
    with KillWhileTestsRun(docker_engine.client, times=1) as killer:
        outcome = verifier.verify(task, diff=GOLD_PATCH)
    assert len(killer.killed) == 1
    # The kill cost an attempt, not the result: the retry graded the patch, and the failure is on record.
    assert outcome.kind == "resolved" and outcome.attempts == 2, outcome.evidence
    (first,) = outcome.evidence["infra_history"]
    assert first["check"] == "container_died" and killer.killed[0] in first["error"]


def test_container_killed_on_every_attempt_ends_infra_error(docker_engine, base_image, lego_config, calc_task):
    verifier = make_verifier(docker_engine, base_image, lego_config, retries=1)
    task = slow_task(calc_task, seconds=3)
    with KillWhileTestsRun(docker_engine.client, times=2) as killer:
        outcome = verifier.verify(task, diff=GOLD_PATCH)
    assert len(killer.killed) == 2
    assert outcome.kind == "infra_error" and outcome.reward is None and outcome.attempts == 2
    assert outcome.evidence["check"] == "container_died"
    assert [entry["check"] for entry in outcome.evidence["infra_history"]] == ["container_died"]


def test_daemon_errors_are_infra_and_retried(docker_engine, base_image, lego_config, calc_task, monkeypatch):
    from docker.errors import APIError
    from docker.models.containers import ContainerCollection

    real_run = ContainerCollection.run
    failures = {"left": 0}

    def flaky_run(self, *args, **kwargs):
        if failures["left"] > 0:
            failures["left"] -= 1
            raise APIError("injected: the daemon could not create the container")
        return real_run(self, *args, **kwargs)

    monkeypatch.setattr(ContainerCollection, "run", flaky_run)
    verifier = make_verifier(docker_engine, base_image, lego_config, retries=2)

    failures["left"] = 99  # the daemon keeps failing: infra_error after every attempt
    outcome = verifier.verify(calc_task, diff=GOLD_PATCH)
    assert outcome.kind == "infra_error" and outcome.attempts == 3
    assert outcome.evidence["check"] == "docker_api_error" and "injected" in outcome.evidence["error"]
    assert len(outcome.evidence["infra_history"]) == 2

    failures["left"] = 1  # one failure: the retry grades
    outcome = verifier.verify(calc_task, diff=GOLD_PATCH)
    assert outcome.kind == "resolved" and outcome.attempts == 2
    assert outcome.evidence["infra_history"][0]["check"] == "docker_api_error"


def test_verifier_timeout_is_infra_and_retried(docker_engine, base_image, lego_config, calc_task):
    verifier = make_verifier(docker_engine, base_image, lego_config, retries=1, timeout_s=2)
    outcome = verifier.verify(slow_task(calc_task, seconds=60), diff=GOLD_PATCH)
    assert outcome.kind == "infra_error" and outcome.attempts == 2
    assert outcome.evidence["check"] == "verifier_timeout"
    assert [entry["check"] for entry in outcome.evidence["infra_history"]] == ["verifier_timeout"]


def test_oom_is_infra_and_a_self_inflicted_kill_is_the_patchs(docker_engine, base_image, lego_config, calc_task):
    verifier = make_verifier(docker_engine, base_image, lego_config, retries=1, memory="160m")
    outcome = verifier.verify(memory_hog_task(calc_task, megabytes=400), diff=GOLD_PATCH)
    assert outcome.kind == "infra_error" and outcome.attempts == 2, outcome.evidence
    assert outcome.evidence["check"] == "oom_killed" and outcome.exit_code == 137
    assert "OOM kills: 1" in outcome.evidence["error"]
    # Exit 137 without the kernel's OOM killer (the code under test SIGKILLs itself) is the patch's doing.
    suicide = (
        "diff --git a/killer.py b/killer.py\nnew file mode 100644\n--- /dev/null\n+++ b/killer.py\n"
        "@@ -0,0 +1,2 @@\n+import os\n+os.kill(os.getpid(), 9)\n"
        "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,6 +1,7 @@\n def add(a, b):\n"
        "-    return a - b\n+    return a + b\n \n \n def mul(a, b):\n+    import killer  # noqa\n     return a * b\n"
    )
    outcome = verifier.verify(calc_task, diff=suicide)
    # Signalling its own test process is the patch reaching for the runner: a cheat, never a free retry.
    assert outcome.kind == "cheat" and "grading_tampered" in outcome.cheat_rules and outcome.attempts == 1, \
        outcome.evidence
