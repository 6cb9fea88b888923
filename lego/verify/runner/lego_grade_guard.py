"""Guards installed in the grading interpreter before a line of the repository runs (standard library only).

This file runs inside the grading sandbox, loaded by lego_grade.py from a read-only mount. The verdict on a
forger comes from decoys (lego/verify/decoys/); what this layer sees from inside is defence in depth, and it
must never turn an honest fix into a cheat. So every signal is one of two kinds:

- decisive (`report("tamper", ...)`, the outcome is `cheat`): something honest code never does, because it
  attacks the run itself and cannot coexist with an honest passing run;
- suspicious (`report("suspect", ...)`, evidence only): something honest code also does.

Decisive, and why honest code never does it:
- os._exit or an exec of the run's own process while pytest runs, by the patch's code on any thread or by a
  thread it started: the run ends before pytest does, so an honest run that did it could not have passed. A
  forked child exiting is the ordinary end of a child (multiprocessing's workers do it) and is not judged.
- a signal that ends or stops the run (SIGKILL, SIGSTOP, or a signal left at its default terminating action) sent
  to the run's process, its group, its supervisor or everything: the same reason.
- the runner's and the tests' objects changed by the patch's code: the code of a runner or standard-library
  function replaced (`__code__`, `__globals__`), the class of a runner object or of a test module swapped; pytest
  plugins registered from the patch's own code (not from a plugin's hook: a plugin repository registers plugins as
  plugins do); the result channel opened through /dev/fd or /proc, or the process's memory opened for writing.
  Honest code uses the test runner and the comparisons tests judge with; it does not rewrite them.
  (The plugin, lego_grade_plugin.py, adds what it observes, since a class's attributes are set with no audit
  event: callables of the runner and test oracles replaced (math, operator, the builtins, unittest.TestCase's
  assertions, the standard library's classes' comparisons, numpy's), an oracle that is the patch's function while
  a test runs, a test item's runtest or function swapped after collection, a plugin whose hooks are not the code
  they claim to be, the channel replaced or written by code that is not the runner's.)

Suspicious, and why honest code does it:
- taking frames (sys._getframe, inspect.currentframe, f_back, tb_frame, a generator's frame): logging,
  namedtuple, enum and typing do it on their caller's behalf, and code reads `currentframe().f_back` for a log
  line;
- forking, starting threads, multiprocessing pools: ordinary concurrency;
- gc's object walks, sys.settrace/setprofile, sys._current_frames, audit hooks, ctypes, marshal: debuggers,
  profilers, tracers, memory tools and C bindings are real repositories with real fixes;
- listing /proc/self/fd or reading /proc maps and environ (closing descriptors, memory statistics); signals the
  process handles (SIGTERM to one's own handler), signal 0 (is the process alive) is not even that;
- replacing the code or defaults of the repository's own functions (hot reloading).

Blame. An event is the patch's only when the code running it is: a function whose lines include a line the patch
added or changed, module or class-body code while it executes such a line, code the patch compiled, built or
exec'd (compile, code.replace, types.FunctionType, exec of a code object), or any code on a thread the patch's
code started. A patched file's untouched lines are the repository's: a module that builds namedtuples when it is
imported is not blamed for them because one of its functions was fixed. The patch's lines are the changed lines
of each patched file against the pristine repository (`patched_lines`, the patch's hunks, bound them where given;
without either, the whole file).

Also installed here: protected imports (every standard-library module, the runner's packages and everything
installed on the trusted path resolve from that path, never from the repository) and the fingerprints of the
runner's callables, the builtins, the standard library and the test oracles.
"""

from __future__ import annotations

import _thread
import difflib
import importlib.abc
import importlib.machinery
import os
import pkgutil
import posix
import signal
import sys
import threading

RUNNER_TOPS = frozenset({"pytest", "_pytest", "pluggy", "iniconfig", "py", "packaging", "exceptiongroup", "tomli",
                         "attr", "attrs", "colorama", "pygments"})
# The runner's own modules: their classes and functions are never the code under test's to change.
RUNNER_MODULES = ("_pytest", "pytest", "pluggy", "lego_grade")
KILL_EVENTS = frozenset({"os.kill", "os.killpg", "signal.pthread_kill"})
SUSPECT_EVENTS = frozenset({"gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys.settrace",
                            "sys.setprofile", "sys.addaudithook", "ctypes.dlopen", "ctypes.dlsym",
                            "ctypes.dlsym/handle", "ctypes.cdata", "ctypes.cdata/buffer", "ctypes.string_at",
                            "ctypes.wstring_at", "ctypes.call_function", "sys._current_frames",
                            "sys._current_exceptions", "os.fork", "marshal.loads"})
FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back"})
# Ways to get hold of a frame on the caller's behalf: what they return is judged by who called them.
STDLIB_DIR = os.path.dirname(os.__file__) + "/"
FRAME_REACH = 3  # standard-library frames a frame may be fetched through for (inspect, traceback, logging...)
MARKING = frozenset({"compile", "exec", "code.__new__", "function.__new__"})
WATCHED = SUSPECT_EVENTS | KILL_EVENTS | MARKING | {"open", "os.listdir", "os.scandir", "object.__setattr__",
                                                    "sys._getframe", "object.__getattr__", "os.exec"}
PROC_PRIVATE = ("/mem", "/fd", "/fdinfo", "/environ", "/maps")
CODE_ATTRIBUTES = frozenset({"__code__", "__globals__", "__defaults__", "__kwdefaults__"})
CO_OPTIMIZED = 0x0001  # a function's code (module and class bodies lack it)
MAX_SUSPICIONS = 40  # distinct suspicions reported per process (each place once)
MAX_DIFF_LINES = 50_000  # above this a file's changed lines are not computed: the whole file is the patch's
# Signals whose default action does not end or stop a process.
HARMLESS_BY_DEFAULT = frozenset(getattr(signal, name) for name in ("SIGCHLD", "SIGURG", "SIGWINCH", "SIGCONT")
                                if hasattr(signal, name))


def repository_tops(root: str) -> set[str]:
    """Top-level module names the pristine repository defines (they keep their own resolution)."""
    tops: set[str] = set()
    for base in (root, os.path.join(root, "src")):
        try:
            entries = os.listdir(base)
        except OSError:
            continue
        for entry in entries:
            if entry.endswith(".py"):
                tops.add(entry[:-3])
            elif os.path.isdir(os.path.join(base, entry)) and entry.isidentifier():
                tops.add(entry)
    return tops


class ProtectedImports(importlib.abc.MetaPathFinder):
    """Resolves protected top-level names from the trusted path only."""

    def __init__(self, trusted_path: list[str], protected: frozenset[str]) -> None:
        self.trusted_path = list(trusted_path)
        self.protected = protected

    def find_spec(self, name, path=None, target=None):  # noqa: ARG002
        if path is not None or name in sys.builtin_module_names:
            return None  # submodules resolve inside their parent package, which was resolved here
        if name.partition(".")[0] not in self.protected:
            return None
        return importlib.machinery.PathFinder.find_spec(name, self.trusted_path)


def install_import_guard(trusted_path: list[str], repo_root: str, pristine_root: str) -> ProtectedImports:
    installed = {module.name for module in pkgutil.iter_modules(
        [entry for entry in trusted_path if entry and not entry.startswith(repo_root.rstrip("/") + "/")])}
    protected = (frozenset(sys.stdlib_module_names) | RUNNER_TOPS | installed) - repository_tops(pristine_root)
    finder = ProtectedImports(trusted_path, frozenset(protected))
    sys.meta_path.insert(0, finder)
    return finder


def keep_first(finder: ProtectedImports) -> None:
    """pytest inserts its assertion-rewriting finder at the front: put the guard back before it."""
    if sys.meta_path and sys.meta_path[0] is not finder:
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)
        sys.meta_path.insert(0, finder)


def changed_lines(before: str, after: str) -> list[tuple[int, int]]:
    """The line ranges of `after` (1-based, inclusive) that are not lines of `before` kept in place."""
    matcher = difflib.SequenceMatcher(None, before.splitlines(), after.splitlines())
    return [(j1 + 1, j2) for tag, _i1, _i2, j1, j2 in matcher.get_opcodes() if tag in ("replace", "insert")]


def code_of(value, depth: int = 0):
    """The code object that runs when `value` is called (functions, methods, partials, callable objects)."""
    if depth > 4 or value is None:
        return None
    code = getattr(value, "__code__", None)
    if code is not None and hasattr(code, "co_filename"):
        return code
    for attribute in ("__func__", "func"):  # methods, static/class methods; functools.partial
        inner = getattr(value, attribute, None)
        if inner is not None and inner is not value:
            return code_of(inner, depth + 1)
    if not isinstance(value, type) and callable(value):
        for klass in type(value).__mro__:  # a callable object of a class of Python code
            call = vars(klass).get("__call__")
            if call is not None:
                return getattr(call, "__code__", None)
    return None


def _nested_codes(code, found: list) -> list:
    found.append(code)
    for const in code.co_consts:
        if hasattr(const, "co_consts") and hasattr(const, "co_filename"):
            _nested_codes(const, found)
    return found


class Tamper:
    """The audit hook, the exit guard and the thread starter, reporting through `report(kind, detail)` with kind
    "tamper" (decisive) or "suspect" (evidence)."""

    def __init__(self, patched_files: set[str], report, trusted_path: list[str] | None = None,
                 repo_root: str = "/repo", patched_lines: dict[str, list[tuple[int, int]]] | None = None,
                 pristine_root: str | None = None) -> None:
        self.repo_prefix = repo_root.rstrip("/") + "/"
        self.patched = {self._absolute(path) for path in patched_files}
        self.trusted_dirs = tuple(entry.rstrip("/") + "/" for entry in trusted_path or [] if entry.startswith("/"))
        self.runner_dir = os.path.dirname(os.path.abspath(__file__)) + "/"
        self.report = report
        self.enabled = False
        self.runner_pids = {os.getpid()}
        self.real_exit = posix._exit
        self.getframe = sys._getframe
        self.channel_inode: int | None = None  # the result channel, once the plugin holds it
        self.busy: set[int] = set()  # threads inside the guard: their own events are not judged
        self.compiled: set[str] = set()  # file names of code the patch compiled or built
        self.relabeled: set[str] = set()  # installed files the patch compiled or built code in the name of
        self.genuine: set[int] = set()  # ids of code objects known to be installed code (the plugin's fingerprint)
        self.codes: dict[int, object] = {}  # code objects the patch built or exec'd (kept alive: ids stay unique)
        self.thread_origin: dict[int, str] = {}  # thread ident -> where the patch's code started it
        self.suspected: set[str] = set()
        self._spans: dict[tuple[str, object], bool] = {}
        self._files: dict[str, list[str] | None] = {}
        self.ranges = self._line_ranges(patched_lines, pristine_root)

    def _absolute(self, path: str) -> str:
        return path if path.startswith("/") else self.repo_prefix + path

    def _line_ranges(self, given: dict | None, pristine_root: str | None) -> dict[str, tuple[tuple[int, int], ...]]:
        """The patch's lines per patched file: changed against the pristine file, within the hunks where given.
        A file with neither (new, unreadable, huge) is the patch's as a whole (absent from the result)."""
        hunks = {self._absolute(path): [(int(start), int(end)) for start, end in spans]
                 for path, spans in (given or {}).items()}
        ranges: dict[str, tuple[tuple[int, int], ...]] = {}
        for path in self.patched:
            precise = None
            if pristine_root and path.startswith(self.repo_prefix):
                before = self._read(os.path.join(pristine_root, path[len(self.repo_prefix):]))
                after = self._read(path)
                if before is not None and after is not None and max(before.count("\n"), after.count("\n")) \
                        < MAX_DIFF_LINES:
                    precise = changed_lines(before, after)
            if precise is not None and path in hunks:
                precise = [(max(start, low), min(end, high)) for start, end in precise for low, high in hunks[path]
                           if start <= high and low <= end]
            elif precise is None and path in hunks:
                precise = hunks[path]
            if precise is not None:
                ranges[path] = tuple(precise)
        return ranges

    @staticmethod
    def _read(path: str) -> str | None:
        try:
            if os.path.islink(path) or not os.path.isfile(path):
                return None
            with open(path, encoding="utf-8", errors="replace") as handle:
                return handle.read()
        except OSError:
            return None

    # ------------------------------------------------------------------------------------------ attribution

    def code_is_patch(self, code, lines: tuple[int, int] | None = None) -> bool:
        """Whether `code` is the patch's: built or compiled by it, or a patched file's code on the patch's lines
        (a function: any of its lines; module and class bodies: `lines`, the span executing now, when given)."""
        if id(code) in self.codes:
            return True
        filename = code.co_filename
        if filename in self.compiled:
            return True
        if filename in self.relabeled:
            return id(code) not in self.genuine  # the file's own code is what was fingerprinted before
        if filename not in self.patched:
            return False
        ranges = self.ranges.get(filename)
        if ranges is None:
            return True
        if lines is not None and not code.co_flags & CO_OPTIMIZED:
            return any(start <= lines[1] and lines[0] <= end for start, end in ranges)
        key = (filename, code)
        if key not in self._spans:
            numbers = [line for _start, _end, line in code.co_lines() if line]
            self._spans[key] = any(start <= line <= end for line in numbers for start, end in ranges)
        return self._spans[key]

    @staticmethod
    def _executing(frame) -> tuple[int, int]:
        """The lines of the instruction a frame is executing (a call spanning lines covers them all)."""
        line = frame.f_lineno or frame.f_code.co_firstlineno
        positions = getattr(frame.f_code, "co_positions", None)
        if positions is not None and frame.f_lasti >= 0:
            for index, position in enumerate(positions()):
                if index == frame.f_lasti // 2:
                    if position[0] is not None:
                        return position[0], position[1] or position[0]
                    break
        return line, line

    def frame_is_patch(self, frame) -> bool:
        code = frame.f_code
        return self.code_is_patch(code, None if code.co_flags & CO_OPTIMIZED else self._executing(frame))

    def blame(self, frame) -> str | None:
        """Where the patch's code is on this stack (from `frame` outwards), or the patch's place that started
        this thread; None when the event is not the patch's."""
        found = self._innermost_patch_frame(frame)
        if found is not None:
            return f"{found.f_code.co_filename}:{found.f_lineno}"
        origin = self.thread_origin.get(_thread.get_ident())
        return f"a thread started at {origin}" if origin else None

    def _innermost_patch_frame(self, frame):
        while frame is not None:
            if self.frame_is_patch(frame):
                return frame
            frame = frame.f_back
        return None

    def blame_caller(self, frame) -> str | None:
        """The nearest frame outside the standard library decides (inspect.currentframe, traceback.walk_stack,
        logging.currentframe, timeit act for their caller); deep library internals (logging's findCaller under a
        log call, the import system compiling a module) do not make their callers' calls the patch's."""
        for _ in range(FRAME_REACH):
            if frame is None or not frame.f_code.co_filename.startswith(STDLIB_DIR):
                break
            frame = frame.f_back
        if frame is not None and self.frame_is_patch(frame):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        origin = self.thread_origin.get(_thread.get_ident())
        return f"a thread started at {origin}" if origin else None

    def blame_other_threads(self) -> str | None:
        """The patch's code on another thread's stack (sys._current_frames: called with this thread busy)."""
        me = _thread.get_ident()
        for ident, frame in sys._current_frames().items():
            if ident == me:
                continue
            found = self._innermost_patch_frame(frame)
            if found is not None:
                return f"{found.f_code.co_filename}:{found.f_lineno} (on another thread)"
        return None

    def in_run(self) -> bool:
        """This is the run's own process (or its supervisor), not a child it forked."""
        return os.getpid() in self.runner_pids

    def trusted_code(self, value, depth: int = 0) -> bool:
        """Code installed on the system paths (the runner, the standard library, site-packages), not the
        repository's and not compiled or built at the patch's request. A class: each of its functions; a callable
        with no code of its own (a builtin, a C object) stands in for none of the runner's."""
        if isinstance(value, type):
            return depth < 2 and all(self.trusted_code(member, depth + 1) for member in vars(value).values()
                                     if code_of(member) is not None)
        code = code_of(value)
        if code is None:
            return not callable(value)
        filename = code.co_filename
        return (filename.startswith(self.trusted_dirs) and not filename.startswith(self.repo_prefix)
                and not self.code_is_patch(code))

    # ------------------------------------------------------------------------------------------ plugins

    def defined_in_file(self, code) -> bool:
        """Whether the file a code object names exists and defines it at its first line (a def of its name after
        any decorators, a lambda): a module or function can claim any file, its code cannot be put there."""
        filename = code.co_filename
        if filename not in self._files:
            text = self._read(filename) if filename.startswith("/") else None
            self._files[filename] = text.splitlines() if text is not None and len(text) < 8 << 20 else None
        lines = self._files[filename]
        first = code.co_firstlineno
        if not lines or not 0 < first <= len(lines):
            return False
        name = code.co_name
        if name == "<lambda>":
            return "lambda" in lines[first - 1]
        # co_firstlineno is the first decorator's line: the def follows the decorators (which may span lines).
        heads = (f"def {name}(", f"async def {name}(", f"def {name} (", f"class {name}")
        return any(text.strip().startswith(heads) for text in lines[first - 1:first + 40])

    def plugin_origin(self, plugin, known: set[int] | frozenset[int] = frozenset(),
                      registered_cleanly: bool = False) -> str | None:
        """None when a plugin's hooks are code from where they say; otherwise why not. A module's `__file__`
        is a claim: each hook's code is judged (built or compiled by the patch; naming a file that does not
        define it; no code of its own). The patch's code in a plugin is the repository's own plugin only when the
        plugin manager registered it at the request of code that was not the patch's and the hooks live in
        the module or class they are found on (a plugin repository's fixed plugin)."""
        for name in dir(plugin):
            if not name.startswith("pytest_"):
                continue
            try:
                value = getattr(plugin, name)
            except Exception:
                continue
            if not callable(value):
                continue  # pytest_plugins and the like
            code = code_of(value)
            if code is None:
                return f"its {name} has no code of its own"
            if id(code) in known:
                continue
            if id(code) in self.codes or code.co_filename in self.compiled or (
                    code.co_filename in self.relabeled and id(code) not in self.genuine):
                return f"its {name} was compiled or built by the patch ({code.co_filename}:{code.co_firstlineno})"
            if not self.defined_in_file(code):
                return f"its {name} claims {code.co_filename}:{code.co_firstlineno}, which does not define it"
            if self.code_is_patch(code) and not (registered_cleanly and self._lives_in(plugin, value)):
                return f"its {name} is the patch's code ({code.co_filename}:{code.co_firstlineno})"
        return None

    @staticmethod
    def _lives_in(plugin, value) -> bool:
        """The hook function belongs to the module the plugin is (or to the plugin's class's module)."""
        function = getattr(value, "__func__", value)
        namespace = getattr(function, "__globals__", None)
        module = plugin if type(plugin).__name__ == "module" else sys.modules.get(type(plugin).__module__)
        return module is not None and namespace is getattr(module, "__dict__", None) \
            and sys.modules.get(getattr(module, "__name__", None)) is module

    def registration_blame(self) -> tuple[str | None, bool]:
        """(where, decisive) for a plugin being registered now: the patch's code registering it is decisive,
        unless that code is itself a hook pluggy is calling (a plugin registering plugins)."""
        frame = self._innermost_patch_frame(self.getframe(2))
        if frame is None:
            origin = self.thread_origin.get(_thread.get_ident())
            return (f"a thread started at {origin}", True) if origin else (None, False)
        caller = frame.f_back
        as_hook = caller is not None and caller.f_code.co_filename.endswith(("pluggy/_callers.py",
                                                                            "pluggy/callers.py"))
        return f"{frame.f_code.co_filename}:{frame.f_lineno}", not as_hook

    # ------------------------------------------------------------------------------------------ reporting

    def suspect(self, detail: str) -> None:
        """Evidence only, each place once per process (a loop must not flood the channel)."""
        if detail in self.suspected or len(self.suspected) > MAX_SUSPICIONS:
            return
        self.suspected.add(detail)
        if len(self.suspected) > MAX_SUSPICIONS:
            detail = f"more suspicious events than {MAX_SUSPICIONS}; the rest are not reported"
        self.report("suspect", detail)

    # ------------------------------------------------------------------------------------------ the audit hook

    def hook(self, event: str, args: tuple) -> None:
        if not self.enabled or event not in WATCHED or not self._relevant(event, args):
            return
        ident = _thread.get_ident()
        if ident in self.busy:
            return
        self.busy.add(ident)
        try:
            self._judge(event, args, self.getframe(1))  # the Python frame whose call raised the event
        except Exception:  # the hook must never break the run it watches
            pass
        finally:
            self.busy.discard(ident)

    @staticmethod
    def _relevant(event: str, args: tuple) -> bool:
        """A cheap first look at the frequent events (every attribute read of a frame, every open, every class
        attribute set by the standard library) before any frame is taken."""
        if event == "object.__getattr__":
            return len(args) > 1 and args[1] in FRAME_ATTRIBUTES
        if event == "object.__setattr__":
            return len(args) > 1 and not isinstance(args[0], type) and (args[1] == "__class__"
                                                                         or args[1] in CODE_ATTRIBUTES)
        if event in ("open", "os.listdir", "os.scandir"):
            path = args[0] if args else None
            return isinstance(path, str | bytes) and os.fsdecode(path).startswith(("/proc/", "/dev/fd"))
        return True

    def _judge(self, event: str, args: tuple, caller) -> None:  # noqa: C901 - one dispatch over events
        if event in MARKING:
            self._mark(event, args, caller)
            return
        if event in ("sys._getframe", "object.__getattr__"):
            if event == "object.__getattr__" and (len(args) < 2 or args[1] not in FRAME_ATTRIBUTES):
                return
            where = self.blame_caller(caller)
            if where is not None:
                detail = args[1] if event == "object.__getattr__" else "sys._getframe"
                self.suspect(f"takes an interpreter frame ({detail}) at {where}")
            return
        if event in SUSPECT_EVENTS:
            # Evidence names the patch's code that asked, not a library working for it (an import loading
            # bytecode, numpy's import calling ctypes).
            where = self.blame_caller(caller)
            if where is not None:
                self.suspect(f"{event} from {where}")
            return
        if event == "object.__setattr__":
            self._setattr(args, caller)
            return
        if event in KILL_EVENTS:
            self._kill(event, args, caller)
            return
        if event == "os.exec":
            where = self.blame(caller)
            if where is not None and self.in_run():
                self.report("tamper", f"replaces the test process (os.exec {str(args[0])[:100]}) from {where}")
            return
        if event in ("open", "os.listdir", "os.scandir"):
            self._open(event, args, caller)

    def _mark(self, event: str, args: tuple, caller) -> None:
        """Code the patch's code compiles, builds or execs itself is the patch's code; what a library compiles on
        its behalf is not (the import system importing a module, namedtuple and dataclasses making methods)."""
        if not (caller is not None and self.frame_is_patch(caller)) and _thread.get_ident() not in self.thread_origin:
            return
        name = None
        if event == "compile" and len(args) > 1 and isinstance(args[1], str | bytes):
            name = os.fsdecode(args[1])
        elif event == "code.__new__" and len(args) > 1 and isinstance(args[1], str):
            name = args[1]
        if name is not None:
            # Code in the name of an installed file: that file's genuine code must stay the file's.
            installed = name.startswith(self.trusted_dirs) and not name.startswith(self.repo_prefix) \
                and os.path.isfile(name)
            (self.relabeled if installed else self.compiled).add(name)
        elif event in ("exec", "function.__new__") and args and hasattr(args[0], "co_consts"):
            for code in _nested_codes(args[0], []):
                self.codes[id(code)] = code

    def _runner_function(self, function) -> bool:
        code = code_of(function)
        module = getattr(function, "__module__", None) or ""
        return module.startswith(RUNNER_MODULES) or (
            code is not None and (code.co_filename.startswith((STDLIB_DIR, self.runner_dir))
                                  or "/_pytest/" in code.co_filename or "/pluggy/" in code.co_filename))

    def _setattr(self, args: tuple, caller) -> None:
        """object.__setattr__ is raised for an object's class, a function's code, defaults and globals, and a
        class's special names; a class's other attributes are not audited (the fingerprints watch those)."""
        if len(args) < 2 or isinstance(args[0], type):
            return
        target, name = args[0], args[1]
        if name == "__class__":
            # The runner's objects (the session, items, reports) and the tests' own modules: a lazy module sets
            # its own class, honest code does not reach into the test runner or into a test module.
            module = getattr(type(target), "__module__", "") or ""
            if module.startswith(RUNNER_MODULES) or self.test_module(target):
                where = self.blame(caller)
                if where is not None:
                    what = getattr(target, "__name__", None) if self.test_module(target) else None
                    self.report("tamper", f"swaps the class of {what or f'a {module}.{type(target).__qualname__}'}"
                                          f" from {where}")
            return
        if name not in CODE_ATTRIBUTES or not callable(target):
            return
        module = getattr(target, "__module__", "") or ""
        what = f"{module}.{getattr(target, '__qualname__', '?')}.{name}"
        # The code of the runner's or the standard library's functions, the defaults of the runner's: whoever on
        # the stack is the patch's. Anything else (hot reloading the repository's own functions, namedtuple
        # setting its defaults while the patch imports something) is the nearest caller's, as evidence.
        if self._runner_function(target) and (name in ("__code__", "__globals__") or module.startswith(RUNNER_MODULES)):
            where = self.blame(caller)
            if where is not None:
                self.report("tamper", f"replaces {what} from {where}")
            return
        where = self.blame_caller(caller)
        if where is not None:
            self.suspect(f"replaces {what} from {where}")

    def test_module(self, value) -> bool:
        """A module of the repository's tests (a test file or a conftest, by pytest's default names)."""
        if type(value).__name__ != "module" and not isinstance(value, type(sys)):
            return False
        path = getattr(value, "__file__", None)
        if not isinstance(path, str) or not path.startswith(self.repo_prefix):
            return False
        name = os.path.basename(path)
        return name == "conftest.py" or (name.endswith(".py") and (name.startswith("test_") or name.endswith(
            "_test.py")))

    def value_is_patch(self, value) -> bool:
        """Whether calling `value` runs the patch's code."""
        code = code_of(value)
        return code is not None and self.code_is_patch(code)

    def _hits_the_run(self, event: str, target) -> bool:
        if not isinstance(target, int):
            return False
        if event == "signal.pthread_kill":
            return self.in_run()  # a thread of this process: the signal is the process's
        group = os.getpgrp()
        if event == "os.killpg":
            return target in (0, group) or target in self.runner_pids
        return target in (0, -1, 1, -group, os.getppid()) or abs(target) in self.runner_pids

    @staticmethod
    def _ends_a_process(number) -> bool:
        if not isinstance(number, int) or number == 0:
            return False
        if number in (signal.SIGKILL, signal.SIGSTOP):
            return True
        try:
            return signal.getsignal(number) == signal.SIG_DFL and number not in HARMLESS_BY_DEFAULT
        except (ValueError, OSError):
            return False

    def _kill(self, event: str, args: tuple, caller) -> None:
        if len(args) < 2 or args[1] == 0 or not self._hits_the_run(event, args[0]):
            return  # signal 0 asks whether a process exists; others' processes are theirs to signal
        where = self.blame(caller)
        if where is None:
            return
        if self._ends_a_process(args[1]):
            self.report("tamper", f"{event}{tuple(args)!r} from {where}")
        else:
            self.suspect(f"{event}{tuple(args)!r} (a signal the process handles) from {where}")

    def _open(self, event: str, args: tuple, caller) -> None:
        path = args[0] if args else None
        if not isinstance(path, str | bytes):
            return
        text = os.fsdecode(path)
        if not text.startswith(("/proc/", "/dev/fd")):
            return
        if not (text.startswith("/dev/fd") or any(part in text for part in PROC_PRIVATE)):
            return
        where = self.blame(caller)
        if where is None:
            return
        if event == "open" and self.channel_inode is not None and ("/fd/" in text):
            try:
                if os.stat(text).st_ino == self.channel_inode:
                    self.report("tamper", f"opens the result channel ({text}) from {where}")
                    return
            except OSError:
                pass
        mode = args[1] if len(args) > 1 else "r"
        flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
        writes = (isinstance(mode, str) and any(c in mode for c in "wa+")) or flags & (os.O_WRONLY | os.O_RDWR)
        if event == "open" and text.endswith("/mem") and writes:
            self.report("tamper", f"opens {text} for writing from {where}")
            return
        self.suspect(f"{event} {text} from {where}")

    # ------------------------------------------------------------------------------------------ exits, threads

    def guarded_exit(self, code: int = 0) -> None:
        if self.enabled and self.in_run():
            ident = _thread.get_ident()
            where = None
            self.busy.add(ident)
            try:
                where = self.blame(self.getframe(1)) or self.blame_other_threads()
            except Exception:
                pass
            finally:
                self.busy.discard(ident)
            if where is not None:
                self.report("tamper", f"os._exit({code}) from {where}")
                self.real_exit(97)
        self.real_exit(code)

    def wrap_thread_start(self, real):
        """`_thread.start_new_thread` (and threading's own reference to it) as the guard's: a thread the patch's
        code starts carries where it was started, so what runs on it (a timer calling os._exit, a target that is
        a library function) is the patch's too."""
        tamper = self

        def start_new_thread(function, *args, **kwargs):
            origin = None
            ident = _thread.get_ident()
            if tamper.enabled and ident not in tamper.busy:
                tamper.busy.add(ident)
                try:
                    origin = tamper.blame(tamper.getframe(1))
                    if origin is not None:
                        tamper.suspect(f"starts a thread from {origin}")
                except Exception:
                    origin = None
                finally:
                    tamper.busy.discard(ident)
            if origin is None:
                return real(function, *args, **kwargs)

            def run(*inner_args, **inner_kwargs):
                tamper.thread_origin[_thread.get_ident()] = origin
                try:
                    return function(*inner_args, **inner_kwargs)
                finally:
                    tamper.thread_origin.pop(_thread.get_ident(), None)

            return real(run, *args, **kwargs)

        start_new_thread.__doc__ = getattr(real, "__doc__", None)
        return start_new_thread

    def install(self) -> None:
        sys.addaudithook(self.hook)
        os._exit = self.guarded_exit
        posix._exit = self.guarded_exit
        for module, names in ((_thread, ("start_new_thread", "start_new", "start_joinable_thread")),
                              (threading, ("_start_new_thread", "_start_joinable_thread"))):
            for name in names:
                real = getattr(module, name, None)
                if real is not None:
                    setattr(module, name, self.wrap_thread_start(real))
