"""Fingerprints of the oracles a test's verdict rests on: comparison methods of standard-library classes,
unittest's assert methods, numpy's comparisons, the builtins, and the runner's own modules and classes.

Taken before the repository's code runs (and, for modules the tests load later, the first time they are seen),
then compared before each test's call and after it. Standard library only: this file runs in the grading container,
loaded by lego_grade.py beside the guard (lego_grade_guard.py), whose `code_of` it is given.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

_MISSING = object()
# What a standard-library class compares with: a test's expectation (a Fraction, a Decimal, a date) judges by these.
COMPARISON_METHODS = frozenset({"__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__contains__",
                                "__instancecheck__", "__subclasscheck__", "__bool__", "__hash__"})
ORACLE_CLASS_PREFIXES = ("assert", "fail")  # unittest.TestCase's judging methods
# Builtins a library may legitimately wrap (I/O, the import hook, interactive helpers): changes are evidence.
BUILTINS_NOT_ORACLES = frozenset({"open", "print", "input", "breakpoint", "help", "exit", "quit", "copyright",
                                  "credits", "license"})
ORACLE_MODULES = frozenset({"math", "cmath", "operator"})
# Oracles of installed packages, fingerprinted the first time they are seen loaded.
LATE_ORACLES = {"numpy": ("isclose", "allclose", "array_equal", "array_equiv", "equal"),
                "numpy.testing": ("assert_allclose", "assert_array_equal", "assert_array_almost_equal",
                                  "assert_almost_equal", "assert_equal", "assert_approx_equal",
                                  "assert_array_less", "assert_string_equal")}


def _callables(namespace: dict) -> dict[str, object]:
    return {name: value for name, value in namespace.items()
            if callable(value) or isinstance(value, property | staticmethod | classmethod)}


class Fingerprint:
    """Identity of every callable in the runner's modules and classes, in builtins and in the standard library's
    modules (their module-level callables), and of the test oracles (unittest.TestCase's assertions, the
    comparison methods of the standard library's classes, numpy's comparisons once numpy is loaded).

    A change to the runner's objects or to an oracle is decisive: honest code uses the test runner and the
    comparisons a test judges with, it does not replace them. Other builtins and standard-library callables are
    replaced by honest libraries (logging.captureWarnings sets warnings.showwarning, gevent patches socket):
    such a change is evidence."""

    def __init__(self, module_prefixes: tuple[str, ...], code_of: Callable[[object], object]) -> None:
        self.prefixes = module_prefixes
        self.code_of = code_of  # the code a callable runs (lego_grade_guard.code_of)
        self.entries: dict[tuple[str, str, str], object] = {}  # keeps the originals alive: ids stay unique
        # The same entries by (module, owner): a check looks each namespace up once, not once per callable (a
        # check runs several times per test over thousands of entries).
        self.by_namespace: dict[tuple[str, str], dict[str, object]] = {}
        self.oracles_by_namespace: dict[tuple[str, str], set[str]] = {}
        self.classes: dict[tuple[str, str], type] = {}
        self.oracles: set[tuple[str, str, str]] = set()
        self.seen: set[str] = set()  # modules fingerprinted (or looked at) so far
        import builtins

        self._take("builtins", "", vars(builtins))
        self._add_oracles([key for key in self.entries if self._oracle(key)])
        self.shared: set[str] = {"builtins"}  # modules the tests share with the code under test
        for name, module in list(sys.modules.items()):
            self.seen.add(name)
            if module is None:
                continue
            if name.partition(".")[0] in sys.stdlib_module_names and name != "sys":
                self._take_stdlib(name, module)
                continue
            if not name.startswith(module_prefixes):
                continue
            namespace = getattr(module, "__dict__", {})
            self._take(name, "", namespace)
            for attr, value in list(namespace.items()):
                if isinstance(value, type) and getattr(value, "__module__", None) == name:
                    self._take(name, attr, dict(vars(value)))
        case = sys.modules.get("unittest.case")
        if case is not None:
            testcase = case.TestCase
            self.classes[("unittest.case", "TestCase")] = testcase
            judging = {attr: value for attr, value in vars(testcase).items() if attr.startswith(ORACLE_CLASS_PREFIXES)}
            self._take("unittest.case", "TestCase", judging)
            self._add_oracles([("unittest.case", "TestCase", attr) for attr in judging])

    def _take_stdlib(self, name: str, module) -> list[tuple[str, str, str]]:
        """A standard-library module: its public callables (what a test computes its expectations with; the
        modules swap private helpers themselves, e.g. warnings.catch_warnings) and its classes' comparison methods
        (Fraction.__eq__: a class's attributes are set with no audit event). Returns the oracle keys taken."""
        self.shared.add(name)
        namespace = getattr(module, "__dict__", {})
        taken = []
        public = {attr: value for attr, value in namespace.items() if not attr.startswith("_")}
        self._take(name, "", public)
        taken += [(name, "", attr) for attr in _callables(public)]
        for attr, value in list(namespace.items()):
            if isinstance(value, type) and getattr(value, "__module__", None) == name:
                compares = {method: member for method, member in vars(value).items()
                            if method in COMPARISON_METHODS and callable(member)}
                if compares:
                    self.classes[(name, attr)] = value
                    self._take(name, attr, compares)
                    taken += [(name, attr, method) for method in compares]
        oracles = [key for key in taken if self._oracle(key)]
        self._add_oracles(oracles)
        return oracles

    @staticmethod
    def _oracle(key: tuple[str, str, str]) -> bool:
        module, owner, attr = key
        if module == "builtins":
            return not attr.startswith("_") and attr not in BUILTINS_NOT_ORACLES
        if owner:
            return attr in COMPARISON_METHODS and module.partition(".")[0] in sys.stdlib_module_names
        return module in ORACLE_MODULES

    def code_ids(self) -> set[int]:
        """The code objects of the callables fingerprinted (genuine: taken before the repository ran)."""
        found = set()
        for value in self.entries.values():
            code = self.code_of(value)
            if code is not None:
                found.add(id(code))
        return found

    def add_class(self, module: str, owner: str, cls: type) -> None:
        """A class that lives in no module namespace (made in a factory): fingerprinted through itself."""
        self.classes[(module, owner)] = cls
        self._take(module, owner, dict(vars(cls)))

    def replace(self, old: object, new: object) -> None:
        """The runner itself replaced `old` by `new` (a wrapper of its own): the fingerprint follows."""
        for key, value in list(self.entries.items()):
            if value is old:
                self._set(key, new)

    def take_late_oracles(self, tamper=None) -> list[str]:
        """Fingerprint the modules loaded since (the standard library's, and numpy's oracles): what the tests
        compare with from now on. Returns the oracles already not genuine when first seen: the patch's code."""
        found: list[tuple[str, str, str]] = []
        for name, module in list(sys.modules.items()):
            if name in self.seen:
                continue
            self.seen.add(name)
            if module is None:
                continue
            if name.partition(".")[0] in sys.stdlib_module_names and name != "sys":
                found += self._take_stdlib(name, module)
            elif name in LATE_ORACLES:
                namespace = getattr(module, "__dict__", {})
                for attr in LATE_ORACLES[name]:
                    value = namespace.get(attr, _MISSING)
                    if value is not _MISSING and callable(value):
                        self._set((name, "", attr), value)
                        self._add_oracles([(name, "", attr)])
                        found.append((name, "", attr))
                self.shared.add(name)
        patch = []
        for module, owner, attr in found:
            code = self.code_of(self.entries[(module, owner, attr)])
            if tamper is not None and code is not None and tamper.code_is_patch(code):
                patch.append(f"{module}:{owner + '.' if owner else ''}{attr}")
        return patch

    def replaced_oracles(self) -> list[tuple[str, object]]:
        """The oracles not what they were now, with what is there instead (checked before each test's call)."""
        found = []
        for (module, owner), attrs in self.oracles_by_namespace.items():
            namespace = self._namespace(module, owner)
            taken = self.by_namespace.get((module, owner), {})
            for attr in attrs:
                current = namespace.get(attr, _MISSING)
                if current is not taken.get(attr) and current is not _MISSING:
                    found.append((f"{module}:{owner + '.' if owner else ''}{attr}", current))
        return found

    def _take(self, module: str, owner: str, namespace: dict) -> None:
        for attr, value in _callables(namespace).items():
            self._set((module, owner, attr), value)

    def _set(self, key: tuple[str, str, str], value: object) -> None:
        """Every write of an entry, so that the index by namespace never differs from `entries`."""
        self.entries[key] = value
        self.by_namespace.setdefault(key[:2], {})[key[2]] = value

    def _add_oracles(self, keys: list[tuple[str, str, str]]) -> None:
        self.oracles.update(keys)
        for module, owner, attr in keys:
            self.oracles_by_namespace.setdefault((module, owner), set()).add(attr)

    def accept_runner_changes(self, tamper) -> None:
        """pytest's own plugins patch pytest while it configures (legacypath does): accept replacements whose
        code is installed runner code, so that later checks are strict."""
        for key, value in list(self.entries.items()):
            current = self._current(*key)
            if current is not value and current is not _MISSING and tamper.trusted_code(current):
                self._set(key, current)

    def _namespace(self, module: str, owner: str):
        """Where an entry of (module, owner) lives now: the module's namespace, or its class's (read-only view)."""
        import builtins

        target = builtins if module == "builtins" else sys.modules.get(module)
        namespace = vars(target) if target is not None else {}
        if (module, owner) in self.classes:
            return vars(self.classes[(module, owner)])
        if owner:
            cls = namespace.get(owner)
            return vars(cls) if isinstance(cls, type) else {}
        return namespace

    def _current(self, module: str, owner: str, attr: str):
        return self._namespace(module, owner).get(attr, _MISSING)

    def changes(self, include_builtins: bool = True) -> tuple[list[str], list[str]]:
        """(decisive, suspicious): entries no longer what they were. The runner's objects and the oracles are
        decisive; other shared callables are evidence. Builtins and the standard library only between tests: a
        test may monkeypatch them (pytest's monkeypatch fixture undoes it at teardown); the runner's own objects
        never."""
        decisive: list[str] = []
        suspicious: list[str] = []
        for (module, owner), taken in self.by_namespace.items():
            shared = module in self.shared
            if shared and not include_builtins:
                continue
            get = self._namespace(module, owner).get
            changed = [attr for attr, value in taken.items() if get(attr) is not value]
            for attr in changed:
                name = f"{module}:{owner + '.' if owner else ''}{attr}"
                if shared and (module, owner, attr) not in self.oracles:
                    suspicious.append(name)
                else:
                    decisive.append(name)
        return decisive, suspicious
