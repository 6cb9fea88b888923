"""`lego ui` in a real headless browser (Debian's Chromium driven by Selenium) over a finished and a live run.

The runs are crafted with the real writer and stages' functions (tests/run_builders.py) in a work dir of their
own; the finished run also has an MLflow run and one rollout trace in a real SQLite tracking store. The test
checks that each panel shows that run's numbers, that the live view follows rollouts and gradings appended while
the page is open, and saves a screenshot of each panel under the test's tmp dir and
.lego-test/artifacts/screenshots/.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from run_builders import (
    EVAL_SAMPLES,
    HARNESS,
    INFRA,
    MIXED,
    Iteration,
    R,
    U,
    craft_run,
    crafted_config,
    grade,
    store_rollouts,
)
from typer.testing import CliRunner

from lego import REPO_ROOT
from lego.pipeline.manifest import RunNotFoundError
from lego.ui import serve
from lego.ui.browser import (
    find_browser,
    full_page_screenshot,
    headless_chromium,
    read_text,
    wait_for_graphs,
    wait_for_text,
    wait_until,
)
from lego.ui.data import global_steps
from lego.workdir import WorkDir

ARTIFACTS = REPO_ROOT / ".lego-test" / "artifacts" / "screenshots"
FINISHED, LIVE = "run-done", "run-live"
# iteration 1 of the finished run: task-a 3/4, task-b 2/4, task-c 1 of 3 graded (+1 infra error): 6/11
ITERATION_1 = {"task-a": [R, R, R, U], "task-b": MIXED, "task-c": [R, U, U, INFRA]}
PEARSON_1 = 0.99931
TRACED = f"rollout-{FINISHED}-1-task-a-0"  # the rollout with a trace in MLflow
TRACE_ID = "tr-5eb1c0de5eb1c0de5eb1c0de5eb1c0de"


def _browser_or_skip() -> None:
    if find_browser() is not None:
        return
    # scripts/setup.sh installs chromium and chromium-driver before it stamps the venv: after it ran (CI runs it),
    # a missing browser is a failure, not a reason to skip.
    if os.environ.get("CI") or (Path(sys.prefix) / ".lego-installed").exists():
        pytest.fail("no chromium/chromedriver on the PATH although scripts/setup.sh ran: rerun it as root, or "
                    "apt-get install chromium chromium-driver")
    pytest.skip("no chromium/chromedriver (scripts/setup.sh was not run here): apt-get install chromium "
                "chromium-driver")


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    return crafted_config(tmp_path_factory.mktemp("ui") / "work")


@pytest.fixture(scope="module")
def work(config) -> WorkDir:
    return WorkDir.create(config.project.work_dir)


def _trace(config, work: WorkDir, mlflow_run_id: str) -> None:
    """One rollout's trace, tagged as the rollout traces are (lego.rollout_id), through MLflow's tracing client."""
    from mlflow.entities import TraceInfo, TraceLocation, TraceState
    from mlflow.tracing.client import TracingClient

    from lego.track.tracker import Tracker

    tracker = Tracker(config, work)
    info = TraceInfo(trace_id=TRACE_ID, trace_location=TraceLocation.from_experiment_id(tracker.experiment_id),
                     request_time=int(time.time() * 1000), execution_duration=1000, state=TraceState.OK,
                     tags={"lego.rollout_id": TRACED, "lego.run_id": FINISHED})
    TracingClient(tracker.uri).start_trace(info)


@pytest.fixture(scope="module")
def runs(config, work) -> dict[str, str]:
    """The finished run (with its MLflow run), then the live one: iteration 0 recorded, 4 of iteration 1's 12
    rollouts stored. Returns the finished run's MLflow run id."""
    from lego.track.tracker import Tracker

    mlflow_run = Tracker(config, work).start_pipeline_run(FINISHED)
    spec = {"routed": True, "rewrite": True}
    craft_run(work, config, FINISHED, [Iteration(**spec), Iteration(kinds=ITERATION_1, pearson=PEARSON_1, subagent=True,
                                                                     eval_kinds=[R, R], **spec)],
              mlflow_run_id=mlflow_run)
    _trace(config, work, mlflow_run)
    craft_run(work, config, LIVE, [Iteration()], status="running", live=Iteration(kinds={"task-a": MIXED}))
    return {"mlflow_run": mlflow_run}


@pytest.fixture(scope="module")
def server(work, config, runs):
    _browser_or_skip()
    with serve(work, config, refresh_s=1.0).start() as running:
        yield running


@pytest.fixture(scope="module")
def driver(server):
    browser = headless_chromium()
    yield browser
    browser.quit()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> list[Path]:
    return [tmp_path_factory.mktemp("screenshots"), ARTIFACTS]


def screenshot(driver, shots: list[Path], name: str) -> None:
    wait_for_graphs(driver)
    for directory in shots:
        full_page_screenshot(driver, directory / f"{name}.png")
    driver.set_window_size(1500, 1000)


def link_of(driver, element_id: str, timeout: float = 60.0) -> str:
    """A link's href, read again when the page re-renders the link while it is read."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    def href(current) -> str | bool:
        try:
            return current.find_element("id", element_id).get_attribute("href") or False
        except StaleElementReferenceException:
            return False

    return WebDriverWait(driver, timeout, poll_frequency=0.25).until(href)


def open_tab(driver, tab: str, timeout: float = 60.0) -> None:
    """Click the tab until its panel shows. A click right after a screenshot's window resize can land while a busy
    page still lays itself out, and be lost: clicked again, not waited on for a minute."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    deadline = time.monotonic() + timeout
    while True:
        driver.find_element("id", f"tab-{tab}").click()
        try:
            WebDriverWait(driver, 5, poll_frequency=0.25).until(
                lambda current: current.find_element("id", f"panel-{tab}").is_displayed())
            return
        except TimeoutException:
            if time.monotonic() > deadline:
                raise TimeoutException(f"the {tab} tab's panel did not show within {timeout:g}s of clicking it") \
                    from None


# ------------------------------------------------------------------------------------------------ finished run


def test_each_panel_shows_the_finished_runs_numbers(server, driver, shots, runs):
    driver.get(f"{server.url}?run={FINISHED}")
    header = wait_for_text(driver, "header", FINISHED)
    wait_for_text(driver, "h-status", "completed")
    assert "finished" in read_text(driver, "h-stage")
    assert read_text(driver, "h-step").split("\n")[1] == "4"  # 2 optimizer steps in each train stage
    assert read_text(driver, "h-iteration").split("\n")[1] == "1"
    assert runs["mlflow_run"] in link_of(driver, "mlflow-run-link"), header

    # overview: the resolved rate per policy (train split: the rollouts' own gradings; eval split) and findings
    curve = wait_for_text(driver, "overview-curve", "6/11")
    assert "6/12 (50.0%" in curve and "2/4 (50.0%" in curve and "4/4 (100.0%" in curve, curve
    assert "infra_errors_rising" in read_text(driver, "findings")
    rewards = read_text(driver, "overview-reward-table")
    assert "rollout/1 12 11 6 0.5455" in rewards, rewards
    assert "train/1" in read_text(driver, "overview-stages")
    screenshot(driver, shots, "finished-overview")

    open_tab(driver, "rollouts")
    stages = wait_for_text(driver, "rollouts-stages", "rollout/1")
    row = next(line for line in stages.split("\n") if line.startswith("rollout/1"))
    assert row.startswith("rollout/1 12 12 0 11") and "resolved 6" in row and "infra_error 1" in row, row
    assert HARNESS in read_text(driver, "rollouts-harness")
    assert "nothing: the run is completed" in read_text(driver, "live-cards")
    screenshot(driver, shots, "finished-rollouts")

    open_tab(driver, "fidelity")
    table = wait_for_text(driver, "fidelity-table", str(PEARSON_1))
    row_0, row_1 = (next(line for line in table.split("\n") if line.startswith(f"rollout/{i}")) for i in (0, 1))
    # Pearson, KL, 3 |Δ|/routing columns absent (—), routing coverage, rewrites, sub-agent calls
    assert row_1.startswith(f"rollout/1 {PEARSON_1} ") and " 100.0% 12 12 " in row_1, row_1
    assert row_0.startswith("rollout/0 0.99998 ") and " 100.0% 12 0 " in row_0, row_0
    screenshot(driver, shots, "finished-fidelity")

    open_tab(driver, "tasks")
    grid = wait_for_text(driver, "task-grid", "task-c")
    lines = {line.split(" ")[0]: line for line in grid.split("\n")}
    assert lines["task-a"] == "task-a 2/4 3/4", lines  # columns: rollout/0, evaluate/0, rollout/1, evaluate/1
    assert lines["task-c"] == "task-c 2/4 1/3 +1 infra", lines
    assert lines["eval-a"] == f"eval-a {EVAL_SAMPLES}/{EVAL_SAMPLES} {EVAL_SAMPLES}/{EVAL_SAMPLES}", lines
    assert lines["eval-b"] == f"eval-b 0/{EVAL_SAMPLES} {EVAL_SAMPLES}/{EVAL_SAMPLES}", lines
    screenshot(driver, shots, "finished-tasks")

    open_tab(driver, "logs")
    logs = wait_for_text(driver, "log-table", f"run {FINISHED} started")
    assert f"rollout {f'rollout-{FINISHED}-1-task-c-3'} graded infra_error" in logs, logs
    assert "train/1 done in" in logs and "run completed" in logs
    driver.find_element("css selector", "#log-level input[value='warning']").click()
    warnings = wait_until(driver, "log-table", lambda text: "started" not in text, "drop the info events")
    assert "infra_errors_rising" in warnings and "graded infra_error" in warnings, warnings
    screenshot(driver, shots, "finished-logs")

    open_tab(driver, "harnesses")
    evaluations = wait_for_text(driver, "harness-evaluations", "evaluate/1")
    finished = [line for line in evaluations.split("\n") if line.startswith(FINISHED)]
    assert [line.split(" ")[1:6] for line in finished] == [
        [HARNESS, "evaluate/0", "(eval", "split)", "1"], [HARNESS, "evaluate/1", "(eval", "split)", "2"]], finished
    assert "2/4 50.0%" in finished[0] and "4/4 100.0%" in finished[1], finished
    rollouts = read_text(driver, "harness-rollouts")
    assert f"{FINISHED} {HARNESS} 24 23 12" in rollouts and f"{LIVE} {HARNESS} 12 12 6" in rollouts, rollouts
    screenshot(driver, shots, "finished-harnesses")


def test_the_trajectory_viewer_shows_tokens_by_mask_with_logprobs_and_experts(server, driver, shots, runs):
    data_run = f"rollout-{FINISHED}-1"
    driver.get(f"{server.url}?run={FINISHED}&tab=trajectory&rollout={data_run}/{TRACED}")
    segment = wait_for_text(driver, "segment-view", "Segment 0")
    assert "routed experts recorded" in segment and "main · start" in segment, segment
    assert wait_for_text(driver, "t-outcome", "resolved")
    tokens = driver.find_element("id", "tokens")
    assert "<tool_call>" in tokens.text and "<|im_start|>" in tokens.text
    sampled = tokens.find_elements("css selector", ".tok-s")
    prompt = tokens.find_elements("css selector", ".tok-p")
    assert sampled and prompt
    # the first sampled token: "I" (id 40) at its position, log-prob -0.25, experts of routing(..) per layer
    first = sampled[0].get_attribute("title")
    assert "id 40 · sampled (mask 1) · logprob -0.2500 (p 0.779)" in first, first
    position = int(first.split(" · ")[0].removeprefix("#"))
    expected = " | ".join(f"L{layer}: " + ",".join(str((position * 3 + layer * 5 + pick) % 8) for pick in range(2))
                          for layer in range(2))
    assert first.endswith(f"experts {expected}"), first
    assert "prompt (mask 0)" in prompt[0].get_attribute("title") and "logprob" not in prompt[0].get_attribute("title")
    calls = read_text(driver, "trajectory-calls")
    assert "rewrite main 1" in calls and "subagent subagent:1 2" in calls, calls
    assert TRACE_ID in link_of(driver, "trace-link")
    screenshot(driver, shots, "finished-trajectory")

    # the sub-agent's segment, chosen in the segment picker
    from selenium.webdriver.support.ui import WebDriverWait

    driver.find_element("id", "segment").click()
    option = WebDriverWait(driver, 30).until(lambda d: next(iter(d.find_elements(
        "xpath", "//*[@id='segment']//*[starts-with(normalize-space(text()), '2 · subagent:1')] | "
                 "//*[@role='option' and starts-with(normalize-space(.), '2 · subagent:1')]")), False))
    option.click()
    segment = wait_for_text(driver, "segment-view", "Segment 2 · subagent:1 · subagent")
    assert "<tool_call>" in read_text(driver, "tokens"), segment


# ------------------------------------------------------------------------------------------------ live run


def test_the_live_view_follows_a_running_rollout_stage(server, driver, shots, work):
    driver.get(f"{server.url}?run={LIVE}&tab=rollouts")
    wait_for_text(driver, "h-status", "running")
    assert "rollout/1" in wait_for_text(driver, "h-stage", "rollout/1")
    done = wait_for_text(driver, "live-done", "4 / 12")
    assert "rollout/1 (in progress)" in done, done
    assert read_text(driver, "live-graded").split("\n")[1] == "0"
    assert "rollout-run-live-1" in read_text(driver, "rollouts-live")
    screenshot(driver, shots, "live-rollouts-before")

    data_run = f"rollout-{LIVE}-1"
    more = store_rollouts(work, data_run, 1, Iteration(kinds={"task-b": MIXED}))  # 4 more rollouts end
    wait_for_text(driver, "live-done", "8 / 12")
    grade(work, data_run, 1, more, MIXED, "verify-live1")  # and a grading starts on them
    outcomes = wait_for_text(driver, "live-outcomes", "resolved 2")
    assert "unresolved 2" in outcomes and "not_graded 4" in outcomes, outcomes
    assert read_text(driver, "live-graded").split("\n")[1] == "4"
    screenshot(driver, shots, "live-rollouts-after")

    open_tab(driver, "tasks")
    grid = wait_for_text(driver, "task-grid", "task-b")
    # columns: rollout/0, evaluate/0 (eval split), rollout/1 (in progress)
    assert {line.split(" ")[0]: line for line in grid.split("\n")}["task-b"] == "task-b 2/4 2/4", grid
    open_tab(driver, "overview")
    rewards = wait_for_text(driver, "overview-reward-table", "rollout/1 (in progress) 8 4 2 0.5")
    assert "rollout/0 12 12 6 0.5" in rewards, rewards
    screenshot(driver, shots, "live-overview")


# ------------------------------------------------------------------------------------------------ the command


def test_the_command_serves_on_loopback_and_prints_the_url(work, runs):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [str(Path(sys.executable).parent / "lego"), "ui", FINISHED, "-c", "test",
               f"project.work_dir={work.root}", "--port", "0"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        url = process.stdout.readline().strip()  # blocks until the server listens (or the command fails)
        assert url.startswith("http://127.0.0.1:"), (url, process.stderr.read() if process.poll() is not None else "")
        with urllib.request.urlopen(url, timeout=30) as page:
            assert page.status == 200 and "<title>Lego</title>" in page.read().decode()
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_an_unknown_run_is_refused_naming_the_runs_there_are(work, config, runs):
    from lego_cli import app

    result = CliRunner().invoke(app, ["ui", "run-nope", "-c", "test", f"project.work_dir={work.root}"])
    assert isinstance(result.exception, RunNotFoundError), result.output
    assert FINISHED in str(result.exception) and LIVE in str(result.exception)


@pytest.mark.parametrize(("steps", "expected"), [
    ([(0, 2), (1, 2)], [2, 4]),  # one row per train stage, counted per stage
    ([(0, 1), (0, 2), (1, 1), (1, 2)], [1, 2, 3, 4]),  # a row per step, the count starting again in each stage
    ([(0, 1), (0, 2), (1, 3), (1, 4)], [1, 2, 3, 4]),  # a count that goes on across stages
])
def test_train_steps_share_one_axis(steps, expected):
    rows = [{"iteration": iteration, "step": step, "loss": 0.1, "metrics": {}} for iteration, step in steps]
    assert [point.step for point in global_steps(rows)] == expected



@pytest.mark.parametrize(("fired", "current", "expected"), [
    (set(), None, FINISHED),  # the page's first call
    ({"url.search"}, LIVE, FINISHED),  # a new address
    ({"tick.n_intervals", "url.search"}, None, FINISHED),  # the first call and a tick together (a busy machine)
    ({"tick.n_intervals"}, None, FINISHED),  # nothing shown yet: the address still says what to show
    ({"tick.n_intervals"}, LIVE, LIVE),  # a tick keeps the run on show
])
def test_the_run_shown_is_the_one_the_address_asks_for_whatever_fires_with_it(fired, current, expected):
    from lego.ui.app import chosen_run

    assert chosen_run(FINISHED, fired, current, [LIVE, FINISHED]) == expected
    assert chosen_run(None, fired, current, [LIVE, FINISHED]) == (current or LIVE)  # no address: shown, or newest


def test_a_render_slower_than_the_refresh_tick_is_still_shown(work, config, runs, driver, monkeypatch):
    """A busy machine makes a render take longer than the refresh period: the next tick must not outdate it (the
    browser drops an outdated answer, and with every answer outdated the page stays empty)."""
    from lego.ui import data

    load_run = data.load_run

    def slow_load_run(*args, **kwargs):
        time.sleep(1.0)  # four ticks
        return load_run(*args, **kwargs)

    monkeypatch.setattr(data, "load_run", slow_load_run)
    with serve(work, config, refresh_s=0.25).start() as running:
        driver.get(f"{running.url}?run={FINISHED}")
        wait_for_text(driver, "h-status", "completed", timeout=120)
        wait_for_text(driver, "overview-curve", "6/11", timeout=30)
