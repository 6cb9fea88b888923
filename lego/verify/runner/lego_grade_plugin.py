"""The pytest plugin of the grading runner (standard library and pytest only; runs inside the grading sandbox).

Two views of every test are sent to the supervisor, and they must agree:
- ours: whether the setup, call and teardown phases raised, seen by the outermost hook wrappers, before any
  report object exists (a forged report cannot change what was raised);
- pytest's: the outcome of its TestReport for each phase.
Between phases it checks that no plugin was registered by the code under test, that no hook implementation
was slipped in, that the runner's callables were not replaced and that the channel is still its own pipe.
After collection it judges, with the patch's own sources, every comparison method the patch's code defines,
however it was attached to its class.
"""

from __future__ import annotations

import json
import os

import pytest

COMPARISONS = ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__contains__", "__instancecheck__",
               "__subclasscheck__")


def _state(outcome) -> str:
    excinfo = outcome.excinfo
    if excinfo is None:
        return "ok"
    if isinstance(excinfo[1], pytest.skip.Exception):
        return "skipped"
    return "raised"


def all_classes() -> list[type]:
    seen: set[int] = set()
    stack: list[type] = [object]
    found = []
    while stack:
        cls = stack.pop()
        if id(cls) in seen:
            continue
        seen.add(id(cls))
        found.append(cls)
        try:
            stack.extend(type.__subclasses__(cls))
        except TypeError:
            continue
    return found


def make_plugin(channel_fd: int, fingerprint, tamper, sources: dict[str, str], operand_ignored, keep_first,
                finder, graded: frozenset[str] = frozenset()):
    """The plugin, with everything it needs held in closures (no attribute of it can be swapped to silence it)."""
    channel_inode = os.fstat(channel_fd).st_ino
    pid = os.getpid()
    state = {"allowed": None, "pm": None}

    real_exit = tamper.real_exit

    def emit(record: dict) -> None:
        record["pid"] = os.getpid()
        data = (json.dumps(record, default=str) + "\n").encode()
        try:
            # Closed, or another file put in its place: the run cannot speak for itself any more, so it ends
            # with a status no result can agree with.
            if os.fstat(channel_fd).st_ino != channel_inode:
                real_exit(98)
            os.write(channel_fd, data)
        except OSError:
            if os.getpid() == pid:
                real_exit(98)

    def check(where: str, between_tests: bool = True) -> None:
        try:
            if os.fstat(channel_fd).st_ino != channel_inode:
                emit({"t": "tamper", "detail": f"the result channel was replaced ({where})"})
        except OSError:
            tamper.real_exit(98)
        changed = fingerprint.changed(include_builtins=between_tests)
        if changed:
            emit({"t": "tamper", "detail": f"runner callables replaced ({where}): {', '.join(changed[:8])}"})
        pm = state["pm"]
        if pm is None:
            return
        allowed = state["allowed"]
        for plugin in pm.get_plugins():
            if id(plugin) in allowed:
                continue
            if plugin is own or tamper.trusted_plugin(plugin):
                allowed.add(id(plugin))  # pytest's own, an installed plugin, a conftest of the repo or test patch
                continue
            emit({"t": "tamper", "detail": f"a plugin was registered by the code under test ({where}): {plugin!r}"[:300]})
            allowed.add(id(plugin))
        for name in ("pytest_runtest_makereport", "pytest_runtest_logreport", "pytest_runtest_call",
                     "pytest_runtest_setup", "pytest_runtest_teardown", "pytest_runtest_protocol",
                     "pytest_report_teststatus", "pytest_pyfunc_call"):
            caller = getattr(pm.hook, name, None)
            for impl in caller.get_hookimpls() if caller is not None else []:
                if id(impl.plugin) not in allowed:
                    emit({"t": "tamper", "detail": f"a {name} implementation was added outside the plugin manager"})
                    allowed.add(id(impl.plugin))

    def judge_comparisons() -> None:
        for cls in all_classes():
            namespace = getattr(cls, "__dict__", {})
            for name in COMPARISONS:
                function = namespace.get(name)
                code = getattr(function, "__code__", None)
                if code is None or code.co_filename not in sources:
                    continue
                verdict = operand_ignored(sources[code.co_filename], code.co_firstlineno, code.co_name, name)
                if verdict:
                    emit({"t": "defeater", "detail": f"{cls.__qualname__}.{name} ({code.co_filename}:"
                                                     f"{code.co_firstlineno}) returns the same whatever it is compared with"})

    class GradePlugin:
        @pytest.hookimpl(trylast=True)
        def pytest_configure(self, config):
            keep_first(finder)

        @pytest.hookimpl(trylast=True)
        def pytest_sessionstart(self, session):
            fingerprint.accept_runner_changes(tamper)
            state["pm"] = session.config.pluginmanager
            state["allowed"] = set()
            check("session start")

        @pytest.hookimpl(trylast=True)
        def pytest_collection_finish(self, session):
            emit({"t": "collected", "ids": [item.nodeid for item in session.items]})
            judge_comparisons()
            check("after collection")

        def pytest_collectreport(self, report):
            if report.failed:
                emit({"t": "collect_error", "id": report.nodeid, "detail": str(report.longrepr)[-1500:]})
            elif report.skipped:  # a whole module skipped (pytest.importorskip at its top): its tests never run
                longrepr = report.longrepr
                emit({"t": "collect_skip", "id": report.nodeid,
                      "reason": str(longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3
                                    else longrepr)[:300]})

        @pytest.hookimpl(hookwrapper=True, tryfirst=True)
        def pytest_runtest_setup(self, item):
            # The full check (builtins and the standard library too) before each graded test; the runner's own
            # objects before every test.
            check(f"before {item.nodeid}", between_tests=item.nodeid in graded)
            outcome = yield
            emit({"t": "phase", "id": item.nodeid, "when": "setup", "state": _state(outcome)})

        @pytest.hookimpl(hookwrapper=True, tryfirst=True)
        def pytest_runtest_call(self, item):
            outcome = yield
            emit({"t": "phase", "id": item.nodeid, "when": "call", "state": _state(outcome)})
            check(f"after {item.nodeid}", between_tests=False)

        @pytest.hookimpl(hookwrapper=True, tryfirst=True)
        def pytest_runtest_teardown(self, item, nextitem):
            outcome = yield
            emit({"t": "phase", "id": item.nodeid, "when": "teardown", "state": _state(outcome)})
            if item.nodeid in graded:
                check(f"after {item.nodeid}'s teardown")

        @pytest.hookimpl(trylast=True)
        def pytest_runtest_logreport(self, report):
            record = {"t": "report", "id": report.nodeid, "when": report.when, "outcome": report.outcome}
            if report.skipped:
                # Why it was skipped (evidence only: a skip in the sandbox usually means a missing dependency).
                longrepr = report.longrepr
                record["reason"] = str(longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3
                                       else longrepr)[:300]
            emit(record)

        def pytest_keyboard_interrupt(self, excinfo):
            # pytest.exit() or an interrupt: the session stopped before its tests ran to the end.
            emit({"t": "interrupted", "detail": f"{excinfo.typename}: {str(excinfo.value)[:200]}"})

        @pytest.hookimpl(trylast=True)
        def pytest_sessionfinish(self, session, exitstatus):
            check("session finish")

    fingerprint.add_class("lego_grade_plugin", "GradePlugin", GradePlugin)
    own = GradePlugin()
    return own, emit
