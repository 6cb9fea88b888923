"""The pytest plugin of the grading runner (standard library and pytest only; runs inside the grading sandbox).

Two views of every test are sent to the supervisor, and they must agree:
- ours: whether the setup, call and teardown phases raised, seen by the outermost hook wrappers, before any
  report object exists (a forged report cannot change what was raised);
- pytest's: the outcome of its TestReport for each phase.

Between phases it checks what honest code never changes (decisive, `tamper`): the runner's callables and the test
oracles (fingerprints), the closures this plugin holds, that this plugin is still registered, that no plugin was
registered by the patch's code or carries hooks that are not the code they claim to be (lego_grade_guard.Tamper
.plugin_origin), that no collected test had its runtest or its function swapped after collection, and that the
channel is still its own pipe written by the runner alone. Other builtins and standard-library callables replaced,
and a test function that is the patch's code, are evidence (`suspect`): honest libraries do the first, and a
repository's tests may inherit from its helpers. After collection it judges, with the patch's own sources, every
comparison method on the patch's lines, however it was attached to its class.
"""

from __future__ import annotations

import _thread
import json
import os
import sys
import types

import pluggy
import pytest

COMPARISONS = ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__contains__", "__instancecheck__",
               "__subclasscheck__")
RUNNER_DIR = os.path.dirname(os.path.abspath(__file__)) + "/"


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


def _test_function(item):
    """The function a collected test runs (methods unwrapped to their function), or None."""
    try:
        obj = item.__dict__.get("_obj") or getattr(item, "obj", None)
    except Exception:
        return None
    return getattr(obj, "__func__", obj)


def make_plugin(channel_fd: int, fingerprint, tamper, sources: dict[str, str], operand_ignored, keep_first,
                finder, graded: frozenset[str] = frozenset()):
    """The plugin, with everything it needs held in closures (no attribute of it can be swapped to silence it).
    The closures are made by the factories below; every cell they hold is recorded here and checked between
    phases."""
    channel_inode = os.fstat(channel_fd).st_ino
    state = {"allowed": None, "pm": None}
    registrations: dict[int, tuple[object, bool]] = {}  # id -> (plugin, registered by code not the patch's)
    functions: dict[int, tuple[object, object]] = {}  # id(item) -> (item, the function collected for it)
    cells: list[tuple[str, object, object]] = []  # (name, closure cell, what it held when the plugin was made)
    tamper.channel_inode = channel_inode
    real_exit = tamper.real_exit

    def final_check() -> None:
        try:
            if state["pm"] is not None and not state["pm"].is_registered(own):
                write({"t": "tamper", "detail": "the runner's plugin was unregistered before the session ended"})
        except Exception:
            pass

    def check_plugins(where: str) -> None:
        pm = state["pm"]
        allowed = state["allowed"]
        if not pm.is_registered(own):
            emit({"t": "tamper", "detail": f"the runner's plugin was unregistered ({where})"})
        candidates = list(pm.get_plugins())
        for caller in list(vars(pm.hook).values()):
            for impl in caller.get_hookimpls() if hasattr(caller, "get_hookimpls") else []:
                if id(impl.plugin) not in allowed and not any(p is impl.plugin for p in candidates):
                    name = getattr(impl.function, "__name__", "hook")
                    emit({"t": "tamper", "detail": f"a {name} implementation was added outside the plugin manager "
                                                   f"({where})"[:300]})
                    allowed.add(id(impl.plugin))
        for plugin in candidates:
            if id(plugin) in allowed:
                continue
            allowed.add(id(plugin))
            if plugin is own:
                continue
            registered = registrations.get(id(plugin))
            clean = registered is not None and registered[0] is plugin and registered[1]
            why = tamper.plugin_origin(plugin, known, clean)
            if why is not None:
                emit({"t": "tamper", "detail": f"a plugin that is not what it claims ({where}): {plugin!r} "
                                               f"({why})"[:400]})

    write, emit = _channel(channel_fd, channel_inode, tamper, real_exit, final_check)
    check = _check(channel_fd, channel_inode, real_exit, emit, fingerprint, tamper, cells, state, check_plugins)
    check_item, check_module, judge_comparisons, judge_items = _judges(emit, fingerprint, tamper, finder, sources,
                                                                       operand_ignored, functions)
    register = _wrap_register(tamper, registrations, emit, fingerprint)
    GradePlugin = _plugin_class(check, check_item, emit, judge_comparisons, judge_items, keep_first, finder,
                                fingerprint, tamper, state, graded)
    fingerprint.add_class("lego_grade_plugin", "GradePlugin", GradePlugin)
    own = GradePlugin()
    known = fingerprint.code_ids()
    tamper.genuine.update(known)
    # What the closures of the runner's functions hold: none of it is ever rebound.
    owners = [write, emit, check_plugins, check, final_check, check_item, check_module, judge_comparisons,
              judge_items, register, *(value for value in vars(GradePlugin).values() if callable(value))]
    cells.extend((f"{function.__qualname__}.{variable}", cell, _cell_value(cell)) for function in owners
                 for variable, cell in zip(function.__code__.co_freevars, function.__closure__ or (), strict=False))
    return own, emit


def _channel(channel_fd: int, channel_inode: int, tamper, real_exit, final_check):
    """The result channel's writers: `write` (the raw one) and `emit` (what the runner's code calls)."""
    pid = os.getpid()

    def write(record: dict) -> None:
        ident = _thread.get_ident()
        tamper.busy.add(ident)
        try:
            caller = tamper.getframe(1).f_code
        except Exception:
            caller = None
        finally:
            tamper.busy.discard(ident)
        if caller is not None and caller is not emit.__code__ and caller is not final_check.__code__:
            record = {"t": "tamper", "detail": f"the result channel was written by code outside the runner "
                                               f"({caller.co_filename}): {str(record)[:120]}"}
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

    def emit(record: dict) -> None:
        # The runner alone writes here (this plugin, the supervisor's child, the guard's reports): a record
        # handed in by other code is a forgery, and is replaced by saying so.
        ident = _thread.get_ident()
        tamper.busy.add(ident)
        try:
            caller = tamper.getframe(1)
            code = caller.f_code if caller is not None else None
            foreign = code is None or not code.co_filename.startswith(RUNNER_DIR) or tamper.code_is_patch(code)
        except Exception:
            foreign = False
        finally:
            tamper.busy.discard(ident)
        if foreign:
            write({"t": "tamper", "detail": f"the result channel was written by code outside the runner "
                                            f"({getattr(code, 'co_filename', '?')}): {str(record)[:120]}"})
            return
        if record.get("t") == "end":
            final_check()
        write(record)

    return write, emit


def _check(channel_fd: int, channel_inode: int, real_exit, emit, fingerprint, tamper, cells, state, check_plugins):
    """The check between phases: the channel, the oracles and runner callables, the closures, the plugins."""

    def check(where: str, between_tests: bool = True) -> None:
        try:
            if os.fstat(channel_fd).st_ino != channel_inode:
                emit({"t": "tamper", "detail": f"the result channel was replaced ({where})"})
        except OSError:
            real_exit(98)
        for name in fingerprint.take_late_oracles(tamper):
            emit({"t": "tamper", "detail": f"a test oracle is the patch's code when first seen: {name}"})
        decisive, suspicious = fingerprint.changes(include_builtins=between_tests)
        if decisive:
            emit({"t": "tamper", "detail": f"runner callables or test oracles replaced ({where}): "
                                           f"{', '.join(decisive[:8])}"})
        for name in suspicious:
            tamper.suspect(f"a shared callable replaced: {name}")
        changed_cells = [name for name, cell, value in cells if _cell_value(cell) is not value]
        if changed_cells:
            emit({"t": "tamper", "detail": f"the runner's closures were changed ({where}): "
                                           f"{', '.join(changed_cells[:8])}"})
        if state["pm"] is not None:
            check_plugins(where)

    return check


def _judges(emit, fingerprint, tamper, finder, sources: dict[str, str], operand_ignored, functions: dict):
    """The checks of a test item (its runtest, function and module), and the judgements after collection."""

    def check_item(item, when: str) -> None:
        # An oracle replaced by the patch's own function while a test runs (put back before the next check):
        # whatever a test's fixtures do to an oracle, the patch's code does not stand in for one.
        for name, value in fingerprint.replaced_oracles():
            if tamper.value_is_patch(value):
                emit({"t": "tamper", "detail": f"a test oracle is the patch's code while {item.nodeid} runs: {name}"})
        if "runtest" in vars(item):
            emit({"t": "tamper", "detail": f"{item.nodeid}: its runtest was replaced ({when})"})
        check_module(item)
        recorded = functions.get(id(item))
        if recorded is not None and recorded[0] is item:
            current = _test_function(item)
            if current is not recorded[1]:
                emit({"t": "tamper", "detail": f"{item.nodeid}: its test function was swapped after collection "
                                               f"({when})"})

    def check_module(item) -> None:
        # A name in a test module for an installed or standard-library module (`operator`, `numpy`) that is no
        # longer that module but a copy holding the patch's code: a test's oracle swapped where it looks it up.
        # (A test that imports a module afresh keeps the old module object, which holds no code of the patch.)
        module = getattr(item, "module", None) if hasattr(item, "obj") else None
        if not isinstance(module, types.ModuleType):
            return
        for name, value in list(vars(module).items()):
            if not isinstance(value, types.ModuleType):
                continue
            real = getattr(value, "__name__", None)
            if not isinstance(real, str) or real.partition(".")[0] not in finder.protected \
                    or sys.modules.get(real) is value:
                continue
            if any(tamper.value_is_patch(member) for member in list(vars(value).values()) if callable(member)):
                emit({"t": "tamper", "detail": f"{item.nodeid}: its module's `{name}` is not {real} but a copy "
                                               f"holding the patch's code"})

    def judge_comparisons() -> None:
        for cls in all_classes():
            namespace = getattr(cls, "__dict__", {})
            for name in COMPARISONS:
                function = namespace.get(name)
                code = getattr(function, "__code__", None)
                if code is None or code.co_filename not in sources or not tamper.code_is_patch(code):
                    continue
                verdict = operand_ignored(sources[code.co_filename], code.co_firstlineno, code.co_name, name)
                if verdict:
                    emit({"t": "defeater", "detail": f"{cls.__qualname__}.{name} ({code.co_filename}:"
                                                     f"{code.co_firstlineno}) returns the same whatever it is compared with"})

    def judge_items(items) -> None:
        for item in items:
            function = _test_function(item)
            functions[id(item)] = (item, function)
            code = getattr(function, "__code__", None)
            if code is not None and tamper.code_is_patch(code):
                tamper.suspect(f"{item.nodeid} runs the patch's code as its test function "
                               f"({code.co_filename}:{code.co_firstlineno})")

    return check_item, check_module, judge_comparisons, judge_items


def _wrap_register(tamper, registrations: dict, emit, fingerprint):
    """pluggy's register, replaced by one that records who registers each plugin."""
    real_register = pluggy.PluginManager.register

    def register(self, plugin, name=None):
        # Who registers a plugin: the patch's own code (not a hook pluggy calls) is decisive.
        where, decisive = None, False
        ident = _thread.get_ident()
        if tamper.enabled and ident not in tamper.busy:
            tamper.busy.add(ident)
            try:
                where, decisive = tamper.registration_blame()
            except Exception:
                where, decisive = None, False
            finally:
                tamper.busy.discard(ident)
        registrations[id(plugin)] = (plugin, where is None)
        if decisive:
            emit({"t": "tamper", "detail": f"a plugin was registered by the code under test from {where}: "
                                           f"{plugin!r}"[:300]})
        elif where is not None:
            tamper.suspect(f"a plugin registered by the patch's hook code at {where}")
        return real_register(self, plugin, name)

    register.__doc__ = real_register.__doc__
    pluggy.PluginManager.register = register
    fingerprint.replace(real_register, register)

    return register


def _plugin_class(check, check_item, emit, judge_comparisons, judge_items, keep_first, finder, fingerprint, tamper,
                  state, graded: frozenset[str]):
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
            judge_items(session.items)
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
            # Setup ran the test's fixtures (and whatever the patch planted among them): the runner's own objects
            # again before the call.
            check(f"before {item.nodeid}'s call", between_tests=False)
            check_item(item, "before its call")
            outcome = yield
            emit({"t": "phase", "id": item.nodeid, "when": "call", "state": _state(outcome)})
            check_item(item, "after its call")
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

    return GradePlugin


_EMPTY = object()


def _cell_value(cell):
    try:
        return cell.cell_contents
    except ValueError:  # not bound yet
        return _EMPTY
