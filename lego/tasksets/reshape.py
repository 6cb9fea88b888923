"""SWE-bench-shape rows from a synthesized task set: the FAIL_TO_PASS tests move out of base_commit into test_patch.

A task `lego tasks synth` makes has its FAIL_TO_PASS tests in the repository at base_commit (the bug was injected
into a package whose suite already checks the behaviour). A real SWE-bench instance has not: its `test_patch` adds
the graded test functions to existing test files, so they sit on lines the test patch wrote. The decoy grader
(lego/verify/decoys/) must be measured on that shape too, so `swebench_shape` rewrites each task:

  1. clone its bundle at base_commit and apply its own test_patch: the graded test files;
  2. remove from the base's test files each FAIL_TO_PASS function (module-level `test_x`, method `Class::test_x`,
     also where the class inherits it from a base class of the same file; `test_x[...]` is function `test_x`),
     decorators included, and commit that as the new base_commit (a task whose test_patch already adds them all,
     as the bundled set's does, keeps its base_commit);
  3. test_patch becomes the diff from the new base to the graded test files: applied to the new base it gives
     exactly the original base plus the original test_patch.

The gold patch is unchanged (a task whose gold patch touches a test file is skipped); PASS_TO_PASS loses the ids
of removed functions. Tasks that cannot be reshaped are skipped with a reason, and the others still are.
Outputs: <out>/tasks.jsonl and <out>/repos/<name>.bundle (one per source bundle, holding the new commits).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from lego.errors import LegoError
from lego.tasksets.gitutil import GitError, apply_patch, bundle, clone, commit_all, diff, git
from lego.tasksets.task import Task, patch_files

RESHAPE_DATE = "2024-01-03T00:00:00+00:00"  # after synth's PRISTINE_DATE and MUTATION_DATE: same input, same hash
ID_SUFFIX = "-swe"
BRANCH_PREFIX = "swe/"
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


class ReshapeError(LegoError):
    """A task set could not be reshaped at all; the message says what to change."""


class TaskNotReshaped(Exception):
    """Why one task is left out; the other tasks are still reshaped."""


class ReshapeOutcome(BaseModel):
    """What became of one input task: its SWE-bench-shape row, or why it was skipped."""

    instance_id: str
    task: Task | None = None
    skipped: str | None = None
    removed: list[str] = []  # FAIL_TO_PASS functions taken out of base_commit (file::Class::name)


# ---------------------------------------------------------------- test functions in a file


@dataclass(frozen=True)
class TestFunction:
    """The function a pytest id names: its file, the classes around it, its name (parameters dropped)."""

    __test__ = False  # not a pytest test class, despite the name

    file: str
    scope: tuple[str, ...]
    name: str

    @classmethod
    def of(cls, test_id: str) -> TestFunction | None:
        """`file.py::Class::test_x[param]` -> (file.py, (Class,), test_x); None for an id that names no function."""
        parts = test_id.split("[", 1)[0].split("::")
        if len(parts) < 2 or not parts[0].endswith(".py") or not all(part.isidentifier() for part in parts[1:]):
            return None
        return cls(parts[0], tuple(parts[1:-1]), parts[-1])

    def __str__(self) -> str:
        return "::".join((self.file, *self.scope, self.name))


def _method_owner(classes: dict[str, ast.ClassDef], cls: ast.ClassDef, name: str,
                  seen: frozenset[str] = frozenset()) -> ast.ClassDef | None:
    """The class whose body defines method `name` for `cls`: itself, or a base class defined beside it (depth
    first, which is Python's order unless bases share a base)."""
    if any(isinstance(node, _FUNCTIONS) and node.name == name for node in cls.body):
        return cls
    for base in cls.bases:
        if isinstance(base, ast.Name) and base.id in classes and base.id not in seen:
            if owner := _method_owner(classes, classes[base.id], name, seen | {cls.name}):
                return owner
    return None


def definition_of(tree: ast.Module, function: TestFunction) -> TestFunction | None:
    """Where the function pytest collects under this id is defined: in its own class, or in a base class of the
    same module it inherits it from (then every subclass's test of that name goes with it); None if nowhere."""
    body: list[ast.stmt] = tree.body
    scope: list[str] = []
    for depth, class_name in enumerate(function.scope):
        classes = {node.name: node for node in body if isinstance(node, ast.ClassDef)}  # the last definition wins
        if class_name not in classes:
            return None
        cls = classes[class_name]
        if depth == len(function.scope) - 1:
            cls = _method_owner(classes, cls, function.name)
            if cls is None:
                return None
        scope.append(cls.name)
        body = cls.body
    if not any(isinstance(node, _FUNCTIONS) and node.name == function.name for node in body):
        return None
    return TestFunction(function.file, tuple(scope), function.name)


def _definitions(tree: ast.Module, definition: TestFunction) -> tuple[list[ast.stmt], list[ast.stmt]]:
    """The body a function is defined in (found by `definition_of`) and every definition of it there (a
    redefinition replaces the earlier one in pytest's eyes, so all of them go)."""
    body: list[ast.stmt] = tree.body
    for class_name in definition.scope:
        body = [node for node in body if isinstance(node, ast.ClassDef) and node.name == class_name][-1].body
    return body, [node for node in body if isinstance(node, _FUNCTIONS) and node.name == definition.name]


def defines(source: str | bytes, function: TestFunction) -> bool:
    """Whether `source` defines the function where pytest would collect it from (inherited methods included)."""
    try:
        return definition_of(ast.parse(source), function) is not None
    except (SyntaxError, ValueError):  # ValueError: null bytes
        return False


def remove_functions(source: str, functions: list[TestFunction]) -> tuple[str, list[TestFunction]]:
    """`source` without the given functions (decorators and the blank lines just above included), and which of
    them it defined, as where they are defined (`definition_of`). A class left with no body gets a `pass` where
    its first removed method was."""
    tree = ast.parse(source)
    # Lines as ast counts them: split at \n only (str.splitlines also splits at form feeds and the like).
    lines = re.findall(r"[^\n]*\n|[^\n]+\Z", source)
    dropped: set[int] = set()  # 0-based line numbers
    passes: dict[int, str] = {}  # 0-based line -> the `pass` line replacing it
    removed: list[TestFunction] = []
    emptied: dict[int, tuple[list[ast.stmt], set[int]]] = {}  # id(body) -> (body, ids of removed statements)
    definitions = [definition_of(tree, function) for function in functions]
    # `test_x[a]` and `test_x[b]` are one function, and so are the tests subclasses inherit from one base class.
    for definition in dict.fromkeys(d for d in definitions if d is not None):
        body, nodes = _definitions(tree, definition)
        removed.append(definition)
        emptied.setdefault(id(body), (body, set()))[1].update(id(node) for node in nodes)
        for node in nodes:
            start = min([node.lineno, *(decorator.lineno for decorator in node.decorator_list)]) - 1
            dropped.update(range(start, node.end_lineno or node.lineno))
            while start > 0 and not lines[start - 1].strip():
                start -= 1
                dropped.add(start)
    for body, gone in emptied.values():
        if body is not tree.body and len(gone) == len(body):
            first = body[0]
            start = min([first.lineno, *(d.lineno for d in getattr(first, "decorator_list", []))]) - 1
            passes[start] = " " * first.col_offset + "pass\n"
    kept = [passes.get(number, line) for number, line in enumerate(lines) if number not in dropped or number in passes]
    return "".join(kept), removed


# ---------------------------------------------------------------- one source repository


def _source_clone(source_bundle: Path, dest: Path) -> Path:
    """A clone of the bundle whose every branch is local, so that a bundle of it (`--all`, refs/heads) keeps the
    original commits reachable for `git clone` too."""
    repo = clone(source_bundle, dest)
    for name in git(repo, "for-each-ref", "--format=%(refname:lstrip=3)", "refs/remotes/origin").split():
        if name != "HEAD" and not git(repo, "rev-parse", "--verify", "-q", f"refs/heads/{name}", check=False).strip():
            git(repo, "update-ref", f"refs/heads/{name}", f"refs/remotes/origin/{name}")
    git(repo, "remote", "remove", "origin")
    return repo


def _checkout(repo: Path, commit: str) -> None:
    git(repo, "checkout", "-q", "--force", "--detach", commit)
    git(repo, "clean", "-q", "-fdx")


def _read(repo: Path, files: list[str]) -> dict[str, bytes | None]:
    """Bytes, not text: a test patch may carry data files too."""
    return {file: (repo / file).read_bytes() if (repo / file).is_file() else None for file in files}


def _applies(repo: Path, patch: str) -> str | None:
    """None when `patch` applies to the work tree, else git's reason (the tree is left as it was)."""
    if not patch.strip():
        return None
    patch_file = repo / ".git" / "lego-check.patch"
    patch_file.write_text(patch)
    try:
        git(repo, "apply", "--check", "--whitespace=nowarn", str(patch_file))
        return None
    except GitError as exc:
        return str(exc)
    finally:
        patch_file.unlink(missing_ok=True)


def _graded_files(repo: Path, task: Task, files: list[str]) -> dict[str, bytes | None]:
    """The test files as the grader sees them: base_commit plus the task's own test_patch."""
    _checkout(repo, task.base_commit)
    if reason := _applies(repo, task.test_patch):
        raise TaskNotReshaped(f"its test_patch does not apply at base_commit: {reason}")
    apply_patch(repo, task.test_patch)
    graded = _read(repo, files)
    _checkout(repo, task.base_commit)
    return graded


def _remove_from_base(repo: Path, functions: list[TestFunction],
                      pass_to_pass: list[str]) -> tuple[list[TestFunction], list[str]]:
    """Take the functions out of the checked-out base's files; return those it defined and the PASS_TO_PASS ids
    whose function is still there (an id of a removed function is one the base no longer has)."""
    removed: list[TestFunction] = []
    kept = list(pass_to_pass)
    for file in sorted({function.file for function in functions}):
        path = repo / file
        if not path.is_file():
            continue  # the task's test_patch adds the whole file: nothing of it is at base_commit
        try:
            source = path.read_bytes().decode("utf-8")  # bytes: \r\n line ends stay as they are
            tree = ast.parse(source)
        except (SyntaxError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
            raise TaskNotReshaped(f"{file} is not UTF-8 Python that parses at base_commit: {exc}") from exc
        try:
            text, gone = remove_functions(source, [f for f in functions if f.file == file])
            ast.parse(text)
        except SyntaxError as exc:
            raise TaskNotReshaped(f"{file} does not parse without its FAIL_TO_PASS functions: {exc}") from exc
        path.write_bytes(text.encode("utf-8"))
        removed += gone
        kept = [test_id for test_id in kept if (function := TestFunction.of(test_id)) is None
                or function.file != file or definition_of(tree, function) not in gone]
    return removed, kept


def _test_patch(repo: Path, graded: dict[str, bytes | None]) -> str:
    """The diff from the checked-out new base to the graded test files; the work tree is restored after."""
    head = git(repo, "rev-parse", "HEAD").strip()
    for file, content in graded.items():
        path = repo / file
        if content is None:
            path.unlink(missing_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
    tracked = set(git(repo, "ls-files", "--", *graded).split("\n"))
    patch = diff(repo, [file for file in graded if graded[file] is not None or file in tracked])
    git(repo, "reset", "-q")
    _checkout(repo, head)
    return patch


def _functions_of(task: Task) -> list[TestFunction]:
    functions = []
    for test_id in task.FAIL_TO_PASS:
        function = TestFunction.of(test_id)
        if function is None:
            raise TaskNotReshaped(f"FAIL_TO_PASS {test_id!r} names no test function (file.py::[Class::]test_name)")
        functions.append(function)
    return list(dict.fromkeys(functions))


def reshape_task(repo: Path, task: Task, bundle_file: Path) -> ReshapeOutcome:
    """One task in the clone `repo` of its bundle: commit its new base there (on branch swe/<instance_id>) and
    return its SWE-bench-shape row, whose bundle will be `bundle_file`. Raises TaskNotReshaped."""
    functions = _functions_of(task)
    test_files = sorted({*task.test_files, *(function.file for function in functions)})
    if touched := sorted(set(patch_files(task.patch)) & set(test_files)):
        raise TaskNotReshaped(f"its gold patch touches test file(s) {', '.join(touched)}")
    graded = _graded_files(repo, task, test_files)
    missing = [str(function) for function in functions if not defines(graded.get(function.file) or b"", function)]
    if missing:
        raise TaskNotReshaped(f"FAIL_TO_PASS function(s) not found in the test files: {', '.join(missing)}")
    removed, pass_to_pass = _remove_from_base(repo, functions, task.PASS_TO_PASS)
    new_base = commit_all(repo, f"{task.repo}: without the tests of {task.instance_id}", RESHAPE_DATE) \
        if removed else task.base_commit
    test_patch = _test_patch(repo, graded)
    if reason := _applies(repo, test_patch) or _applies(repo, task.patch):
        raise TaskNotReshaped(f"a patch does not apply at the new base_commit: {reason}")
    # A branch keeps the new base in the bundle (and reachable by `git clone`); a skipped task's commit is not.
    git(repo, "update-ref", f"refs/heads/{BRANCH_PREFIX}{task.instance_id}{ID_SUFFIX}", new_base)
    row = task.model_dump(mode="json", exclude_none=True)
    row.update(
        instance_id=task.instance_id + ID_SUFFIX, base_commit=new_base, test_patch=test_patch,
        PASS_TO_PASS=pass_to_pass,
        environment={**row["environment"], "bundle": str(bundle_file.resolve())},
        provenance={**task.provenance, "swebench_shape": {
            "source_instance": task.instance_id, "source_base_commit": task.base_commit,
            "removed_from_base": [str(function) for function in removed]}},
    )
    if task.environment_setup_commit == task.base_commit:
        row["environment_setup_commit"] = new_base
    return ReshapeOutcome(instance_id=task.instance_id, task=Task.model_validate(row),
                          removed=[str(function) for function in removed])


# ---------------------------------------------------------------- a task set


def _bundle_names(tasks: list[Task]) -> dict[str, str]:
    """A file name (no suffix) for each source bundle: its own, made unique."""
    names: dict[str, str] = {}
    for task in tasks:
        source = task.environment.bundle
        if task.environment.kind != "bundle" or not source or source in names:
            continue
        stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(source).stem)
        name, number = stem, 1
        while name in names.values():
            number += 1
            name = f"{stem}-{number}"
        names[source] = name
    return names


def _refuse_overwriting_sources(tasks: list[Task], out: Path) -> None:
    for task in tasks:
        source = task.environment.bundle
        if task.environment.kind == "bundle" and source and Path(source).resolve().parent.parent == out.resolve():
            raise ReshapeError(f"the output directory {out} is the source task set's own directory: its tasks.jsonl "
                               f"and repos/ would be overwritten. Give another output directory (--out)")


def swebench_shape(tasks: list[Task], out: Path,
                   on_outcome: Callable[[ReshapeOutcome], None] | None = None) -> list[Task]:
    """Reshape `tasks` (bundle tasks, as `load_tasks` gives them) into `out`; see the module docstring.

    Each task's outcome (its row, or why it was skipped) goes to `on_outcome` as it is decided. The rows written
    to <out>/tasks.jsonl are returned in input order, their bundle paths absolute (as `load_tasks` would give)."""
    out = Path(out).resolve()
    _refuse_overwriting_sources(tasks, out)
    names = _bundle_names(tasks)
    reshaped: list[Task] = []
    with tempfile.TemporaryDirectory(prefix="lego-reshape-") as tmp:
        repos: dict[str, Path] = {}
        for task in tasks:
            outcome = _outcome(task, names, repos, Path(tmp), out)
            if outcome.task is not None:
                reshaped.append(outcome.task)
            if on_outcome is not None:
                on_outcome(outcome)
        if not reshaped:
            return []
        for source, repo in repos.items():
            bundle(repo, out / "repos" / f"{names[source]}.bundle")
    (out / "tasks.jsonl").write_text("".join(_row_line(task, out) for task in reshaped))
    return reshaped


def _row_line(task: Task, out: Path) -> str:
    """The task's JSONL line, its bundle named relative to the task set's directory as synth names it."""
    row = task.model_dump(mode="json", exclude_none=True)
    row["environment"]["bundle"] = Path(row["environment"]["bundle"]).relative_to(out).as_posix()
    return json.dumps(row, sort_keys=True) + "\n"


def _outcome(task: Task, names: dict[str, str], repos: dict[str, Path], work: Path, out: Path) -> ReshapeOutcome:
    """Reshape one task in its source's clone (made on first use), or say why not."""
    source = task.environment.bundle
    try:
        if task.environment.kind != "bundle" or not source:
            raise TaskNotReshaped(f"its environment is {task.environment.kind!r}, not a git bundle")
        if not Path(source).is_file():
            raise TaskNotReshaped(f"its bundle {source} does not exist")
        if source not in repos:
            repos[source] = _source_clone(Path(source), work / names[source])
        return reshape_task(repos[source], task, out / "repos" / f"{names[source]}.bundle")
    except (TaskNotReshaped, GitError, subprocess.CalledProcessError) as exc:
        return ReshapeOutcome(instance_id=task.instance_id, skipped=str(exc))
