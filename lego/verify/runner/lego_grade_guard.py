"""Guards installed in the grading interpreter before a line of the repository runs (standard library only).

This file runs inside the grading sandbox, loaded by lego_grade.py from a read-only mount. What it protects,
and why each holds for a whole class rather than for spellings:

- Protected imports. Every standard-library module, the test runner's own packages and everything installed
  on the trusted `sys.path` resolve from that path, never from the repository, whatever file the patch adds
  (`inspect.py`, `pluggy/`, a `.pth`, a `sitecustomize.py`): a meta-path finder placed first decides for
  those names. Names the pristine repository itself defines at its top level keep their usual resolution.
- Tamper events. Python's audit hooks cannot be removed once added. The hook records the primitives a forger
  needs (reading the interpreter's objects through gc, tracing frames, ctypes, replacing a function's code,
  exec'ing over the interpreter, signalling the runner, reaching file descriptors through /proc) when the
  patch's own code is on the stack, or code that the patch's code compiled.
- Forced exits. `os._exit` is wrapped: an exit forced from the patch's code is recorded before it happens.
- Integrity. The callables of the runner's modules and classes, and the builtins, are fingerprinted once the
  runner is set up; any replacement is reported wherever it came from.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import pkgutil
import posix
import sys

RUNNER_TOPS = frozenset({"pytest", "_pytest", "pluggy", "iniconfig", "py", "packaging", "exceptiongroup", "tomli",
                         "attr", "attrs", "colorama", "pygments"})
KILL_EVENTS = frozenset({"os.kill", "os.killpg", "signal.pthread_kill"})
ALWAYS_TAMPER = frozenset({"gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys.settrace",
                           "sys.setprofile", "os.exec", "sys.addaudithook", "ctypes.dlsym", "ctypes.dlsym/handle",
                           "ctypes.cdata", "ctypes.cdata/buffer", "ctypes.string_at", "ctypes.wstring_at",
                           "ctypes.call_function", "sys._current_frames", "sys._current_exceptions"})
FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back"})
# Ways to get hold of a frame on the caller's behalf: what they return is judged by who called them.
STDLIB_DIR = os.path.dirname(os.__file__) + "/"
FRAME_REACH = 3  # standard-library frames a frame may be fetched through for (inspect, traceback, logging...)
WATCHED = ALWAYS_TAMPER | KILL_EVENTS | {"open", "os.listdir", "os.scandir", "object.__setattr__", "compile",
                                         "sys._getframe", "object.__getattr__"}
PROC_PRIVATE = ("/mem", "/fd", "/fdinfo", "/environ", "/maps")


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


class Tamper:
    """The audit hook and the exit guard, reporting through `report(kind, detail)`."""

    def __init__(self, patched_files: set[str], report, trusted_path: list[str] | None = None,
                 repo_root: str = "/repo") -> None:
        self.patched = set(patched_files)
        self.trusted_dirs = tuple(entry.rstrip("/") + "/" for entry in trusted_path or [] if entry.startswith("/"))
        self.repo_prefix = repo_root.rstrip("/") + "/"
        self.report = report
        self.busy = False
        self.enabled = False
        self.runner_pids = {os.getpid()}
        self.real_exit = posix._exit
        self.getframe = sys._getframe

    def trusted_code(self, value) -> bool:
        """Code installed on the system paths (the runner, the standard library, site-packages), not the
        repository's and not compiled at the patch's request."""
        function = getattr(value, "__func__", value)
        code = getattr(function, "__code__", None)
        if code is None:
            return not callable(value) or type(value).__module__ in ("builtins",)
        filename = code.co_filename
        return (filename.startswith(self.trusted_dirs) and not filename.startswith(self.repo_prefix)
                and filename not in self.patched)

    def trusted_plugin(self, plugin) -> bool:
        if type(plugin).__name__ == "module":
            filename = getattr(plugin, "__file__", None) or ""
            if os.path.basename(filename) == "conftest.py":
                return filename not in self.patched  # the repository's or the test patch's: the patch's are dropped
            return filename.startswith(self.trusted_dirs) and not filename.startswith(self.repo_prefix)
        for cls in type(plugin).__mro__[:-1]:
            for value in vars(cls).values():
                if getattr(getattr(value, "__func__", value), "__code__", None) is not None \
                        and not self.trusted_code(value):
                    return False
        return True

    def _patched_on_stack(self, depth: int = 2) -> str | None:
        frame = self.getframe(depth)
        while frame is not None:
            filename = frame.f_code.co_filename
            if filename in self.patched:
                return f"{filename}:{frame.f_lineno}"
            frame = frame.f_back
        return None

    def hook(self, event: str, args: tuple) -> None:
        if not self.enabled or self.busy or event not in WATCHED:
            return
        self.busy = True
        try:
            self._judge(event, args)
        except Exception:  # the hook must never break the run it watches
            pass
        finally:
            self.busy = False

    def _judge(self, event: str, args: tuple) -> None:
        if event == "compile":
            # Code the patch's own code compiles (exec of a string, timeit, ...) counts as the patch's code;
            # what the import system compiles while the patch imports something does not.
            caller = self.getframe(2)  # _judge, hook, then the Python frame whose call raised the event
            filename = args[1] if len(args) > 1 else None
            if caller is not None and caller.f_code.co_filename in self.patched and isinstance(filename, str | bytes):
                self.patched.add(os.fsdecode(filename))
            return
        if event in ("sys._getframe", "object.__getattr__"):
            # Frames reach the runner's locals (its channel, its exit): the patch's own code may not take one.
            if event == "object.__getattr__" and (len(args) < 2 or args[1] not in FRAME_ATTRIBUTES):
                return
            # The nearest frame outside the standard library decides (inspect.currentframe, traceback.walk_stack,
            # logging.currentframe hand frames to their caller); deep library internals (logging's findCaller
            # under a log call) do not make a log call a tamper.
            caller = self.getframe(2)
            for _ in range(FRAME_REACH):
                if caller is None or not caller.f_code.co_filename.startswith(STDLIB_DIR):
                    break
                caller = caller.f_back
            if caller is not None and caller.f_code.co_filename in self.patched:
                detail = args[1] if event == "object.__getattr__" else "sys._getframe"
                self.report("tamper", f"takes an interpreter frame ({detail}) at "
                                      f"{caller.f_code.co_filename}:{caller.f_lineno}")
            return
        where = self._patched_on_stack(3)
        if where is None:
            return
        if event in ALWAYS_TAMPER:
            self.report("tamper", f"{event} from {where}")
        elif event in KILL_EVENTS:
            target = args[0] if args else None
            if event == "os.killpg" or target in (0, -1, 1) or target in self.runner_pids or target == os.getppid():
                self.report("tamper", f"{event}{tuple(args)!r} from {where}")
        elif event == "object.__setattr__":
            if len(args) >= 2 and args[1] in ("__code__", "__globals__", "__closure__") and callable(args[0]):
                self.report("tamper", f"replaces {getattr(args[0], '__qualname__', '?')}.{args[1]} from {where}")
        elif event in ("open", "os.listdir", "os.scandir"):
            path = args[0] if args else None
            if isinstance(path, int) and event == "open":
                return
            text = os.fsdecode(path) if isinstance(path, str | bytes) else ""
            if text.startswith(("/proc/", "/dev/fd")) and (text.startswith("/dev/fd") or any(
                    part in text for part in PROC_PRIVATE)):
                self.report("tamper", f"{event} {text} from {where}")

    def guarded_exit(self, code: int = 0) -> None:
        if self.enabled:
            where = None
            try:
                where = self._patched_on_stack(2)
            except Exception:
                pass
            if where is not None:
                self.report("tamper", f"os._exit({code}) from {where}")
                self.real_exit(97)
        self.real_exit(code)

    def install(self) -> None:
        sys.addaudithook(self.hook)
        os._exit = self.guarded_exit
        posix._exit = self.guarded_exit


_MISSING = object()


def _callables(namespace: dict) -> dict[str, object]:
    return {name: value for name, value in namespace.items()
            if callable(value) or isinstance(value, property | staticmethod | classmethod)}


class Fingerprint:
    """Identity of every callable in the runner's modules and classes, in builtins and in the standard library's
    modules (their module-level callables)."""

    def __init__(self, module_prefixes: tuple[str, ...]) -> None:
        self.prefixes = module_prefixes
        self.entries: dict[tuple[str, str, str], object] = {}  # keeps the originals alive: ids stay unique
        self.classes: dict[tuple[str, str], type] = {}
        import builtins

        self._take("builtins", "", vars(builtins))
        self.shared: set[str] = {"builtins"}  # modules the tests share with the code under test
        for name, module in list(sys.modules.items()):
            if module is None:
                continue
            if name.partition(".")[0] in sys.stdlib_module_names and name != "sys":
                # What a test computes its expectations with (math.isclose, json.loads, operator.eq...): the
                # public callables (the modules swap private helpers themselves, e.g. warnings.catch_warnings).
                self._take(name, "", {attr: value for attr, value in getattr(module, "__dict__", {}).items()
                                      if not attr.startswith("_")})
                self.shared.add(name)
                continue
            if not name.startswith(module_prefixes):
                continue
            namespace = getattr(module, "__dict__", {})
            self._take(name, "", namespace)
            for attr, value in list(namespace.items()):
                if isinstance(value, type) and getattr(value, "__module__", None) == name:
                    self._take(name, attr, dict(vars(value)))

    def add_class(self, module: str, owner: str, cls: type) -> None:
        """A class that lives in no module namespace (made in a factory): fingerprinted through itself."""
        self.classes[(module, owner)] = cls
        self._take(module, owner, dict(vars(cls)))

    def _take(self, module: str, owner: str, namespace: dict) -> None:
        for attr, value in _callables(namespace).items():
            self.entries[(module, owner, attr)] = value

    def accept_runner_changes(self, tamper: Tamper) -> None:
        """pytest's own plugins patch pytest while it configures (legacypath does): accept replacements whose
        code is installed runner code, so that later checks are strict."""
        for key, value in list(self.entries.items()):
            current = self._current(*key)
            if current is not value and current is not _MISSING and tamper.trusted_code(current):
                self.entries[key] = current

    def _current(self, module: str, owner: str, attr: str):
        import builtins

        target = builtins if module == "builtins" else sys.modules.get(module)
        namespace = vars(target) if target is not None else {}
        if (module, owner) in self.classes:
            namespace = vars(self.classes[(module, owner)])
        elif owner:
            cls = namespace.get(owner)
            namespace = vars(cls) if isinstance(cls, type) else {}
        return namespace.get(attr, _MISSING)

    def changed(self, include_builtins: bool = True) -> list[str]:
        """Entries no longer what they were. Builtins and the standard library only between tests: a test may
        monkeypatch them (pytest's monkeypatch fixture undoes it at teardown); the runner's own objects never."""
        import builtins

        found = []
        cache: dict[tuple[str, str], dict] = {}
        for (module, owner, attr), value in self.entries.items():
            if not include_builtins and module in self.shared:
                continue
            key = (module, owner)
            if key not in cache:
                target = builtins if module == "builtins" else sys.modules.get(module)
                namespace = vars(target) if target is not None else {}
                if key in self.classes:
                    namespace = dict(vars(self.classes[key]))
                elif owner:
                    cls = namespace.get(owner)
                    namespace = dict(vars(cls)) if isinstance(cls, type) else {}
                cache[key] = namespace
            if cache[key].get(attr, None) is not value:
                found.append(f"{module}:{owner + '.' if owner else ''}{attr}")
        return found
