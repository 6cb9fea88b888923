"""The verdict from the grading runner's report: what passed, what was forged, what the decoys say.

Pure functions of the report (lego/verify/runner/lego_grade.py) and of the grading's decoy layout, which only the
host knows (lego/verify/decoys/). Why decoys decide: lego/verify/pytest_grading.py.
"""

from __future__ import annotations

from lego.cache import content_hash
from lego.errors import tail
from lego.tasksets.task import Task
from lego.verify.decoys import DecoyLayout
from lego.verify.grading import InfraFailure

RUNNER_CRASH_CODES = {2: "interrupted or collection errors", 3: "internal error", 4: "usage error",
                      5: "no tests collected"}


def status_of_test(entry: dict | None) -> str:
    """passed | failed | skipped | forged | missing, from both views of one test in one run. The runner's
    `passed_in` is the same rule for "passed": it skips the alone runs when a group has no passing member."""
    if not entry:
        return "missing"
    ours = {when: states[-1] for when, states in entry.get("ours", {}).items()}
    reported = {when: outcomes[-1] for when, outcomes in entry.get("pytest", {}).items()}
    ours_passed = all(ours.get(when) == "ok" for when in ("setup", "call", "teardown"))
    pytest_passed = bool(reported) and all(outcome == "passed" for outcome in reported.values()) \
        and reported.get("call") == "passed"
    if pytest_passed and not ours_passed:
        return "forged" if "raised" in ours.values() or not ours else "failed"
    if ours_passed and pytest_passed:
        return "passed"
    if "skipped" in ours.values() or "skipped" in reported.values():
        return "skipped"
    return "failed"


def failed_in_call(entry: dict | None) -> bool:
    """A decoy's expected end: set up fine, then pytest says its call failed. The call raised, as the runner saw
    it, or ended without raising where unittest's TestCase caught its own failure and reported it to pytest. A
    forger gains nothing from a decoy that looks failed: that is what an honest fix produces."""
    if not entry:
        return False
    ours = {when: states[-1] for when, states in entry.get("ours", {}).items()}
    reported = {when: outcomes[-1] for when, outcomes in entry.get("pytest", {}).items()}
    return (ours.get("setup") == "ok" and ours.get("call") in ("raised", "ok")
            and reported.get("setup") == "passed" and reported.get("call") == "failed")


def judge_decoys(tests: dict, layout: DecoyLayout, ids: list[str], where: str) -> dict[str, list[str]]:
    """The decoys among `ids` in one run: `passed` beside a real test that passed (the rule decoy_passed),
    `matched` (a decoy passed where its real test did not: a wrong value that happens to be a decoy's; reward 0
    either way), and `inconclusive` (neither passed nor failed in its call while its real test passed)."""
    found: dict[str, list[str]] = {"passed": [], "matched": [], "inconclusive": []}
    for decoy in ids:
        original = layout.decoys.get(decoy)
        if original is None:
            continue
        real_passed = status_of_test(tests.get(layout.real[original])) in ("passed", "forged")
        decoy_status = status_of_test(tests.get(decoy))
        if decoy_status in ("passed", "forged"):
            found["passed" if real_passed else "matched"].append(f"{original} ({where})")
        elif real_passed and not failed_in_call(tests.get(decoy)):
            found["inconclusive"].append(f"{original} ({where}: {decoy_status})")
    return found


def judge_report(report: dict, task: Task, layout: DecoyLayout | None = None) -> tuple[
        bool, dict[str, list[str]], dict, InfraFailure | None]:
    """(resolved, rules fired, evidence, a failure to attribute with a control run) from the runner's report.
    Without a layout, the tests ran under their own names with no decoy."""
    if layout is None:
        layout = DecoyLayout.identity([*task.FAIL_TO_PASS, *task.PASS_TO_PASS], list(task.FAIL_TO_PASS))
    rules: dict[str, list[str]] = {}
    runs = report.get("runs") or []
    full = runs[0] if runs else {}
    evidence: dict = {"runs": [{key: run.get(key) for key in ("name", "exit_code", "end_rc", "timed_out",
                                                               "seconds", "oom_kills")} for run in runs]}

    def fire(rule: str, detail: str) -> None:
        rules.setdefault(rule, []).append(tail(detail))

    _judge_runner_signals(report, runs, fire, evidence)
    if not runs:
        return False, rules, evidence, InfraFailure("runner_killed", "the grading runner reported no run")
    failure = _judge_process(full, "the test run", fire)
    if failure is not None:
        return False, rules, evidence, failure
    tests = full.get("tests", {})
    renamed = {graded: original for original, graded in layout.real.items()}
    statuses = {test: status_of_test(tests.get(layout.real.get(test, test)))
                for test in [*task.FAIL_TO_PASS, *task.PASS_TO_PASS]}
    for test, entry in tests.items():
        if status_of_test(entry) == "forged":
            fire("test_report_forged", f"{renamed.get(test, test)}: pytest reports it passed, but the test raised")
    decoys = judge_decoys(tests, layout, list(layout.decoys), "the full run")
    alone: dict[str, str] = {}
    for run in runs[1:]:
        failure = _judge_process(run, f"{run.get('name')} alone", fire, alone=True)
        if failure is not None:
            return False, rules, evidence, failure
        group = run.get("group") or []
        run_tests = run.get("tests", {})
        for graded in group:
            if graded in renamed:
                status = status_of_test(run_tests.get(graded))
                # Alone with no decoy (one test, or a parametrized one's cases) the run must end clean; beside
                # decoys (which fail) pytest returns 1.
                clean = run.get("end_rc") == (1 if any(member in layout.decoys for member in group) else 0)
                if status == "passed" and not (clean and run.get("exit_code") == run.get("end_rc")):
                    status = "failed"
                alone[renamed[graded]] = status
        for key, found in judge_decoys(run_tests, layout, group, f"{run.get('name')}").items():
            decoys[key] += found
    for detail in decoys["passed"]:
        fire("decoy_passed", f"a decoy of {detail} passed: the patch passes tests whether or not their expectation "
                             "is right")
    report_view = {
        "FAIL_TO_PASS": {"success": [t for t in task.FAIL_TO_PASS if statuses[t] == "passed"],
                         "failure": [t for t in task.FAIL_TO_PASS if statuses[t] != "passed"]},
        "PASS_TO_PASS": {"success": [t for t in task.PASS_TO_PASS if statuses[t] == "passed"],
                         "failure": [t for t in task.PASS_TO_PASS if statuses[t] != "passed"]},
    }
    disagree = [test for test, status in alone.items() if statuses.get(test) == "passed" and status != "passed"]
    all_passed = all(status == "passed" for status in statuses.values())
    resolved = (all_passed and not disagree and set(alone) >= set(task.FAIL_TO_PASS)
                and not decoys["passed"] and not decoys["inconclusive"])
    f2p_passed = len(report_view["FAIL_TO_PASS"]["success"])
    _skip_evidence(full, statuses, tests, layout, evidence)
    if report.get("alone_skipped"):
        evidence["alone_skipped"] = report["alone_skipped"]
    evidence.update(report=report_view, statuses=statuses, alone=alone, tests_seen=len(tests),
                    decoys=_decoy_evidence(layout, decoys),
                    resolution="RESOLVED_FULL" if resolved else ("RESOLVED_PARTIAL" if f2p_passed else "RESOLVED_NO"))
    if disagree:
        evidence["fail_to_pass_alone_disagrees"] = disagree
    return resolved, rules, evidence, None


def _judge_runner_signals(report: dict, runs: list[dict], fire, evidence: dict) -> None:
    """What the in-process layer saw: decisive findings fire rules; suspicions are evidence only."""
    for run in runs:
        for detail in run.get("tamper", []):
            fire("grading_tampered", f"{run['name']}: {detail}")
        for detail in run.get("defeaters", []):
            fire("assertion_defeater", detail)
        if run.get("suspicions"):
            evidence.setdefault("suspicions", {})[run["name"]] = run["suspicions"][:50]
        if run.get("foreign_records"):
            evidence.setdefault("foreign_records", {})[run["name"]] = run["foreign_records"]
    for detail in report.get("static_defeaters", []):
        fire("assertion_defeater", detail)
    config = report.get("config", {})
    if config.get("pristine") != config.get("graded"):
        pristine, graded = config.get("pristine") or {}, config.get("graded") or {}
        changed = sorted(key for key in {*pristine, *graded, *pristine.get("ini", {}), *graded.get("ini", {})}
                         if pristine.get(key, pristine.get("ini", {}).get(key))
                         != graded.get(key, graded.get("ini", {}).get(key)))
        fire("pytest_config_added", f"the patch changes what pytest's configuration does: {', '.join(changed)}")


def _judge_process(run: dict, label: str, fire, alone: bool = False) -> InfraFailure | None:
    """How the test process ended, against what pytest said: a failure to attribute, or rules."""
    failure = _run_failure(run, label)
    if failure is not None:
        return failure
    exit_code, end_rc = run.get("exit_code"), run.get("end_rc")
    tests = run.get("tests", {})
    if end_rc is None:
        if alone:
            return None  # judged by its tests' statuses: none passed without pytest's end
        if exit_code == 0:
            fire("grading_tampered", f"{label}: the test process exited 0 before pytest finished")
            return None
        return InfraFailure("runner_killed", f"the test process ended (exit {exit_code}) before pytest finished",
                            run.get("log_tail", ""), exit_code)
    if exit_code != end_rc:
        fire("grading_tampered", f"{label}: the test process exited {exit_code} but pytest returned {end_rc}")
    elif end_rc in RUNNER_CRASH_CODES and not alone:
        return InfraFailure(
            "runner_crash", f"pytest exited {end_rc} ({RUNNER_CRASH_CODES[end_rc]}): "
            f"{tail('; '.join(run.get('collect_errors', [])))}", run.get("log_tail", ""), end_rc)
    if run.get("interrupted") and end_rc == 0:
        fire("grading_tampered", f"{label}: the session was stopped ({run['interrupted']}) yet pytest returned 0")
    raised = any("raised" in states for entry in tests.values() for states in entry.get("ours", {}).values())
    # An expected failure (xfail) raises and pytest reports it skipped: exit 0 is right then. Only a raise that
    # pytest reported otherwise contradicts a 0.
    raised_unexpectedly = any(
        "raised" in states and "skipped" not in entry.get("pytest", {}).get(when, [])
        for entry in tests.values() for when, states in entry.get("ours", {}).items())
    if end_rc == 0 and raised_unexpectedly:
        fire("grading_tampered", f"{label}: pytest returned 0 although a test raised")
    if end_rc == 1 and not raised and not any(
            outcome == "failed" for entry in tests.values() for outcomes in entry.get("pytest", {}).values()
            for outcome in outcomes):
        fire("grading_tampered", f"{label}: pytest returned 1 (tests failed) although every test passed")
    duplicated = sorted(test for test, entry in tests.items()
                        if any(len(states) > 1 for states in entry.get("ours", {}).values()))
    if duplicated:
        fire("grading_tampered", f"{label}: more than one result for one phase of {', '.join(duplicated[:5])}")
    return None


def _skip_evidence(full: dict, statuses: dict[str, str], tests: dict, layout: DecoyLayout, evidence: dict) -> None:
    """Why graded tests were skipped or never ran: what `lego tasks validate` turns into advice."""
    skipped = {test: tests[layout.real.get(test, test)].get("skip_reason", "")
               for test, status in statuses.items() if status == "skipped"}
    module_skips = full.get("collect_skips") or {}
    skipped.update({test: f"its module was skipped: {module_skips[test.split('::')[0]]}"
                    for test, status in statuses.items()
                    if status == "missing" and test.split("::")[0] in module_skips})
    if skipped:
        evidence["skip_reasons"] = skipped
    if full.get("collect_errors"):
        evidence["collect_errors"] = full["collect_errors"][:20]


def _decoy_evidence(layout: DecoyLayout, found: dict[str, list[str]]) -> dict:
    # The digest tells two gradings' test files apart (names, order and values are drawn anew every time).
    evidence: dict = {"count": len(layout.decoys), "tests_with_decoys": len(layout.drawn), "drawn": layout.drawn,
                      "files_digest": content_hash(*(f"{path}\0{text}" for path, text in sorted(layout.files.items())))}
    for key, items in found.items():
        if items:
            evidence[key] = items[:20]
    if layout.unrewritable:
        evidence["unrewritable"] = layout.unrewritable
    return evidence


def _run_failure(run: dict, label: str) -> InfraFailure | None:
    if run.get("timed_out"):
        return InfraFailure("verifier_timeout", f"{label} ran past its time limit", run.get("log_tail", ""),
                            run.get("exit_code"))
    if run.get("oom_kills", 0) > 0:
        return InfraFailure("oom_killed", f"{label} was killed by the kernel's OOM killer "
                            f"(OOM kills: {run['oom_kills']})", run.get("log_tail", ""),
                            run.get("exit_code"))
    return None


def runner_log(report: dict) -> str:
    parts = []
    for run in report.get("runs", []):
        parts.append(f"===== {run.get('name')} {run.get('test') or ''} (exit {run.get('exit_code')}, pytest "
                     f"{run.get('end_rc')}, {run.get('seconds')}s) =====\n{run.get('log_tail', '')}")
    return "\n".join(parts)


