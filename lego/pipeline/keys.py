"""Content keys: what a stage's result depends on, hashed.

A stage's code version is derived from what the stage runs, never from a hand-kept list of sources. Starting at
the stage's module (STAGE_MODULES), the import closure inside the `lego` package is followed statically: every
`import` / `from ... import` anywhere in a module (lazy ones inside functions included, relative ones resolved),
the packages on the way (their `__init__` runs), and any string literal naming a project module, as registries
for `importlib.import_module` do ("lego.harness.openhands:OpenHands"). Added to those modules' sources:

- the SQL files they load by name (`load_sql("advantages")` -> sql/advantages.sql; a name that is not a string
  literal could be any of them, so every sql/*.sql file counts);
- the files a module uses at run time without importing them, declared in a module-level `RUNTIME_FILES = (...)`
  (e.g. lego/verify/pytest_grading.py mounts its `runner/` directory into the grading container): each entry is a path
  relative to the module's directory, a module-level name, or a `Path(__file__)...` expression; a directory
  counts with every file under it. The declaration is read statically with `ast`, never imported.

The closure is per module, not per function: importing one name of a module counts all of that module's imports.
Task-set contents and config values are not code: each stage keys them among its inputs.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lego import REPO_ROOT
from lego.cache import content_hash
from lego.errors import LegoError

PACKAGE = "lego"
SQL_LOADER = "load_sql"  # lego.data.sql.load_sql(name): sql/<name>.sql
RUNTIME_DECLARATION = "RUNTIME_FILES"  # a module's declaration of the non-Python files it uses at run time
MODULE_STRING = re.compile(r"^lego(?:\.\w+)+(?::[\w.]+)?$")  # "lego.x.y" or "lego.x.y:attr"

# Where each stage starts (modules of lego.pipeline): its code version covers what that module imports.
STAGE_PACKAGE = "lego.pipeline"
STAGE_MODULES: dict[str, str] = {
    "taskset": "taskset_stage",
    "warmstart": "warmstart_stage",
    "filter": "filter_stage",
    "rollout": "rollout_stage",
    "verify": "verify_stage",
    "dataset": "dataset_stage",
    "train": "train_stage",
    "evaluate": "evaluate_stage",
    "baseline": "baseline_stage",
}


class CodeKeyError(LegoError):
    """A stage's code version cannot be derived (unknown stage, a RUNTIME_FILES entry that cannot be read)."""


@dataclass
class ModuleFacts:
    """What one module's source says it needs (read with ast, never imported)."""

    imports: set[str] = field(default_factory=set)  # dotted names, maybe outside the project or not modules
    sql: set[str] = field(default_factory=set)  # sql/<name>.sql files loaded by literal name
    any_sql: bool = False  # load_sql called with a computed name
    runtime: tuple[str, ...] = ()  # RUNTIME_FILES, as posix paths relative to the module's directory


# Facts by (module, is a package, content digest): copies of a tree, and every stage, share the parsing.
_facts_cache: dict[tuple[str, bool, bytes], ModuleFacts] = {}


def module_facts(name: str, source: bytes, is_package: bool = False) -> ModuleFacts:
    """What the source of module `name` imports, loads from sql/ and declares in RUNTIME_FILES."""
    cache_key = (name, is_package, hashlib.sha256(source).digest())
    if cache_key not in _facts_cache:
        _facts_cache[cache_key] = _read_facts(name, source, is_package)
    return _facts_cache[cache_key]


def _read_facts(name: str, source: bytes, is_package: bool) -> ModuleFacts:
    tree = ast.parse(source, filename=name)
    package = name if is_package else name.rpartition(".")[0]
    facts = ModuleFacts()
    assignments: dict[str, ast.expr] = {}
    for statement in tree.body:
        if isinstance(statement, ast.Assign | ast.AnnAssign) and statement.value is not None:
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            assignments.update((target.id, statement.value) for target in targets if isinstance(target, ast.Name))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            facts.imports.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                if node.level - 1 >= len(parts):
                    continue  # beyond the top package: not ours
                base = ".".join(parts[:len(parts) - (node.level - 1)])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            facts.imports.add(base)
            # `from package import name` imports the submodule when there is one (the closure checks)
            facts.imports.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_STRING.match(node.value):
            facts.imports.add(node.value.partition(":")[0])  # the closure keeps its prefixes that are modules
        elif isinstance(node, ast.Call) and _called_name(node.func) == SQL_LOADER and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                facts.sql.add(f"sql/{first.value if first.value.endswith('.sql') else first.value + '.sql'}")
            else:
                facts.any_sql = True
    if RUNTIME_DECLARATION in assignments:
        facts.runtime = tuple(_runtime_entries(name, assignments))
    return facts


def _runtime_entries(name: str, assignments: dict[str, ast.expr]) -> list[str]:
    """RUNTIME_FILES evaluated statically, relative to the module's directory."""
    here = "__file__"  # a stand-in for the module's file name (only its directory matters)

    def evaluate(node: ast.expr, seen: frozenset[str]) -> list[str]:
        if isinstance(node, ast.Tuple | ast.List):
            return [item for element in node.elts for item in evaluate(element, seen)]
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [posixpath.normpath(node.value)]
        if isinstance(node, ast.Name) and node.id in assignments and node.id not in seen:
            return evaluate(assignments[node.id], seen | {node.id})
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Path"
                and len(node.args) == 1 and isinstance(node.args[0], ast.Name) and node.args[0].id == "__file__"):
            return [here]
        if isinstance(node, ast.Attribute) and node.attr == "parent":
            return [posixpath.normpath(posixpath.join(item, "..")) for item in evaluate(node.value, seen)]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "resolve" \
                and not node.args:
            return evaluate(node.func.value, seen)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.right, ast.Constant) \
                and isinstance(node.right.value, str):
            return [posixpath.normpath(posixpath.join(item, node.right.value)) for item in evaluate(node.left, seen)]
        raise CodeKeyError(f"{name}.{RUNTIME_DECLARATION}: cannot read {ast.unparse(node)!r} statically; list "
                           "paths relative to the module's directory, module-level names or Path(__file__) "
                           "expressions")

    entries = evaluate(assignments[RUNTIME_DECLARATION], frozenset({RUNTIME_DECLARATION}))
    if here in entries:
        raise CodeKeyError(f"{name}.{RUNTIME_DECLARATION}: the module itself is counted already")
    return entries


class _Project:
    """The modules of one source tree (`root` holds lego/ and sql/)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()
        self._facts: dict[str, ModuleFacts] = {}
        self._paths: dict[str, Path | None] = {}

    def module_path(self, name: str) -> Path | None:
        if name not in self._paths:
            path = None
            if name == PACKAGE or name.startswith(PACKAGE + "."):
                base = self.root.joinpath(*name.split("."))
                if (base / "__init__.py").is_file():
                    path = base / "__init__.py"
                elif base.with_suffix(".py").is_file():
                    path = base.with_suffix(".py")
            self._paths[name] = path
        return self._paths[name]

    def facts(self, name: str) -> ModuleFacts:
        if name not in self._facts:
            path = self.module_path(name)
            assert path is not None
            self._facts[name] = module_facts(name, path.read_bytes(), path.name == "__init__.py")
        return self._facts[name]

    def stage_module(self, stage: str) -> str:
        if stage not in STAGE_MODULES:
            raise CodeKeyError(f"unknown stage {stage!r}; stages: {', '.join(STAGE_MODULES)}")
        module = f"{STAGE_PACKAGE}.{STAGE_MODULES[stage]}"
        if self.module_path(module) is None:
            raise CodeKeyError(f"stage {stage!r}: its module {module} is not in {self.root}")
        return module

    def closure(self, entry: str) -> list[str]:
        """The project modules `entry` imports, transitively (packages on the way included), sorted."""
        seen: set[str] = set()
        pending = [entry]
        while pending:
            parts = pending.pop().split(".")
            for end in range(1, len(parts) + 1):
                module = ".".join(parts[:end])
                if module not in seen and self.module_path(module) is not None:
                    seen.add(module)
                    pending.extend(self.facts(module).imports)
        return sorted(seen)

    def files(self, modules: list[str]) -> list[Path]:
        """The files those modules run: their sources, the SQL they load and their declared runtime files."""
        files: set[Path] = set()
        for module in modules:
            path = self.module_path(module)
            facts = self.facts(module)
            files.add(path)
            files.update(self.root / relative for relative in facts.sql)
            if facts.any_sql:
                files.update((self.root / "sql").glob("*.sql"))
            for relative in facts.runtime:
                entry = Path(os.path.normpath(path.parent / relative))
                where = f"{module}.{RUNTIME_DECLARATION}: {relative}"
                if not entry.is_relative_to(self.root):
                    raise CodeKeyError(f"{where} is outside {self.root}")
                if not entry.exists():
                    raise CodeKeyError(f"{where} ({entry}) does not exist")
                files.update(_tree(entry))
        return sorted(files, key=lambda p: p.relative_to(self.root).as_posix())


def _called_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _tree(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return [p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]


def stage_files(stage: str, root: Path = REPO_ROOT, extra: tuple[str, ...] = ()) -> list[str]:
    """The files (relative to `root`, sorted) whose names and bytes make up a stage's code version.

    `extra`: more paths (files or directories, relative to `root`) to count."""
    return _stage_files(_Project(root), stage, extra)


def stage_code_version(stage: str, root: Path = REPO_ROOT, extra: tuple[str, ...] = ()) -> str:
    """A hash of the names and bytes of `stage_files` (read afresh on every call)."""
    return _digest(_Project(root), stage, extra)


def _stage_files(project: _Project, stage: str, extra: tuple[str, ...]) -> list[str]:
    files = project.files(project.closure(project.stage_module(stage)))
    for relative in extra:
        files.extend(_tree(project.root / relative))
    return sorted({p.relative_to(project.root).as_posix() for p in files})


def _digest(project: _Project, stage: str, extra: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    for relative in _stage_files(project, stage, extra):
        digest.update(relative.encode() + b"\0")
        digest.update(hashlib.sha256((project.root / relative).read_bytes()).digest())
    return digest.hexdigest()[:16]


_code_cache: dict[str, str] = {}
_repo_project: list[_Project] = []  # this checkout's modules, parsed once for all stages


def code_version(stage: str, extra: tuple[str, ...] = ()) -> str:
    """The code version of a stage in this checkout (see the module docstring). Computed once per process."""
    cache_key = stage + "|" + "|".join(extra)
    if cache_key not in _code_cache:
        if not _repo_project:
            _repo_project.append(_Project(REPO_ROOT))
        _code_cache[cache_key] = _digest(_repo_project[0], stage, extra)
    return _code_cache[cache_key]


def key_of(parts: dict[str, Any]) -> str:
    return content_hash(json.dumps(parts, sort_keys=True, default=str), length=20)


def checkpoint_key(path: Path, full_hash_limit_bytes: int = 512 * 1024 * 1024) -> str:
    """Identify a policy checkpoint by content: small checkpoints are hashed whole; big ones by their config,
    marker and weight-file names, sizes and modification times (hashing hundreds of GB per run is not an option)."""
    path = Path(path)
    files = sorted(p for p in path.rglob("*") if p.is_file())
    total = sum(p.stat().st_size for p in files)
    digest = hashlib.sha256()
    for file in files:
        digest.update(str(file.relative_to(path)).encode())
        if total <= full_hash_limit_bytes or file.suffix in (".json", ".jinja", ".txt"):
            with open(file, "rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(chunk)
        else:
            stat = file.stat()
            digest.update(f"{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:20]
