"""SWE-style tasks from a Python package by procedural bug injection.

For a package (a local directory, or an sdist from PyPI) with a pytest suite:
  1. copy its source into a git repo and commit it (the pristine commit);
  2. read what the suite needs installed (its runtime and test dependencies, lego/tasksets/testdeps.py), pin
     them, and run the suite in a host venv with exactly those and the sandbox's pytest: the tests that pass
     are the baseline, and the pinned requirements become each task's `environment.requires`;
  3. for candidate mutations of function bodies (see mutate.py), in seeded random order: apply one,
     run the suite, and keep it when at least one baseline test now fails (a mutation no test notices
     is not a task);
  4. commit each kept mutation on its own branch on top of the pristine commit: that commit is the
     task's base_commit, and the gold patch is the reverse diff;
  5. check every task from the bundle: at base_commit FAIL_TO_PASS fail, with the gold patch
     FAIL_TO_PASS and PASS_TO_PASS pass. Tasks that do not check out are dropped.
PASS_TO_PASS is every baseline test that still passes with the mutation (the whole suite, as SWE-bench's is);
a sample only when `p2p_sample` asks for one, recorded in the task's provenance.
Outputs: <out>/tasks.jsonl and <out>/repos/<package>.bundle.

Tests run through a `TestRunner` (`run_tests(repo_dir, test_ids) -> {test_id: status}`), locally
with the current interpreter's pytest by default, so a sandbox backend can take over.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from lego.cache import cache_dir
from lego.errors import LegoError, tail
from lego.tasksets.environment import EnvironmentSpec
from lego.tasksets.gitutil import apply_patch, bundle, clone, commit_all, diff, git, init_repo
from lego.tasksets.mutate import Mutation, find_mutations, shuffled
from lego.tasksets.packages import PackageFetchError, pin, test_python
from lego.tasksets.task import Task
from lego.tasksets.testdeps import read_test_dependencies
from lego.tasksets.testrun import PASSED, TestRunner, parse_pytest_summary, run_pytest, run_tests

PRISTINE_DATE = "2024-01-01T00:00:00+00:00"
MUTATION_DATE = "2024-01-02T00:00:00+00:00"
_SKIP_DIRS = {".git", "__pycache__", ".tox", ".nox", ".venv", "venv", "build", "dist", ".eggs",
              ".pytest_cache", ".mypy_cache", "docs", "doc", "examples", "benchmarks"}


# Another project's code copied in: a bug planted there is not a bug of this package.
_VENDORED = {"_vendor", "vendor", "_vendored", "vendored", "third_party", "_third_party", "externals"}


class SynthError(LegoError):
    """Task synthesis could not start or produced nothing; the message says what to change."""


@dataclass
class SynthReport:
    tasks: list[Task]
    tasks_file: Path | None
    bundle_file: Path | None
    package: str
    version: str
    candidates_tried: int = 0
    undetected: int = 0  # mutations no baseline test noticed
    rejected: list[str] = field(default_factory=list)  # why other candidates were dropped


# ---------------------------------------------------------------- getting the source


def download_sdist(requirement: str, dest: Path) -> Path:
    """`pip download --no-deps --no-binary :all: NAME==VER` and unpack; return the source root.

    A pinned requirement's sdist is kept in the download cache: a release's sdist does not change."""
    dest.mkdir(parents=True, exist_ok=True)
    cached = cache_dir("sdists", _safe(requirement)) if "==" in requirement else None
    if cached is not None and any(cached.iterdir()):
        for archive in cached.iterdir():
            shutil.copy2(archive, dest / archive.name)
    else:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", str(dest),
               requirement]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SynthError(f"pip could not download an sdist of {requirement!r}: {tail(proc.stderr.strip())}")
        if cached is not None:
            for archive in dest.iterdir():
                shutil.copy2(archive, cached / archive.name)
    archives = [p for p in dest.iterdir() if p.name.endswith((".tar.gz", ".tgz", ".zip", ".tar.bz2"))]
    if not archives:
        raise SynthError(f"pip downloaded no sdist archive for {requirement!r} into {dest}")
    unpacked = dest / "src"
    if archives[0].suffix == ".zip":
        with zipfile.ZipFile(archives[0]) as archive:
            archive.extractall(unpacked)
    else:
        with tarfile.open(archives[0]) as archive:
            archive.extractall(unpacked, filter="data")
    roots = [p for p in unpacked.iterdir() if p.is_dir()]
    return roots[0] if len(roots) == 1 else unpacked


def _package_identity(root: Path, requirement: str | None) -> tuple[str, str]:
    if requirement and "==" in requirement:
        name, version = requirement.split("==", 1)
        return name.strip(), version.strip()
    text = (root / "pyproject.toml").read_text() if (root / "pyproject.toml").is_file() else ""
    name = re.search(r'^name\s*=\s*"([^"]+)"', text, re.M)
    version = re.search(r'^version\s*=\s*"([^"]+)"', text, re.M)
    return (name.group(1) if name else root.name), (version.group(1) if version else "0")


def _is_test_file(rel: Path) -> bool:
    return (any(part in ("tests", "test", "testing") for part in rel.parts[:-1])
            or rel.name.startswith("test_") or rel.name.endswith("_test.py") or rel.name == "conftest.py")


def _copy_source(root: Path, repo: Path) -> None:
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(part in _SKIP_DIRS or part.endswith(".egg-info") for part in rel.parts) or not path.is_file():
            continue
        target = repo / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)


def candidate_files(repo: Path) -> list[Path]:
    """Library source files (not tests, not packaging scripts) relative to the repo."""
    files = []
    for path in sorted(repo.rglob("*.py")):
        rel = path.relative_to(repo)
        if rel.parts[0] == ".git" or _is_test_file(rel) or rel.name in ("setup.py", "noxfile.py", "conftest.py") \
                or _VENDORED.intersection(rel.parts[:-1]):
            continue
        files.append(rel)
    return files


# ---------------------------------------------------------------- problem statements


def _failure_messages(log: str) -> dict[str, str]:
    messages = {}
    for line in log.splitlines():
        if line.startswith("FAILED ") and " - " in line:
            test_id, message = line[len("FAILED "):].split(" - ", 1)
            messages[test_id.strip()] = message.strip()
    return messages


def problem_statement(package: str, failing: list[str], messages: dict[str, str]) -> str:
    """A user-style report built from what a user sees: failing tests and their assertion messages."""
    first = failing[0].split("::")[-1]
    lines = [
        f"{package}: `{first}` and {len(failing) - 1} other test(s) fail" if len(failing) > 1
        else f"{package}: `{first}` fails",
        "",
        f"After a recent change, part of {package} no longer behaves as its own test suite expects. "
        "Running the tests gives these failures:",
        "",
    ]
    for test_id in failing[:8]:
        message = messages.get(test_id, "")
        lines.append(f"- `{test_id}`" + (f": {message[:300]}" if message else ""))
    if len(failing) > 8:
        lines.append(f"- ... and {len(failing) - 8} more")
    lines += ["", "Expected: these tests pass, as they did before, without changing the tests.", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------- synthesis


def _statuses(runner: TestRunner, repo: Path, python: str | None = None) -> tuple[dict[str, str], str]:
    """Run the whole suite; with the default runner (in the venv `python`) keep the log for assertion messages."""
    if runner is run_tests or python is not None:
        _, log = run_pytest(repo, python=python)
        return parse_pytest_summary(log), log
    return runner(repo, None), ""


def _environment_of(root: Path, package: str) -> tuple[EnvironmentSpec, dict]:
    """The pinned environment the package's suite needs, and where its requirements were read (provenance)."""
    declared = read_test_dependencies(root, package)
    try:
        pinned = pin(declared.requirements)
    except PackageFetchError as exc:
        raise SynthError(f"{package}'s test dependencies ({', '.join(declared.requirements)}) could not be "
                         f"fetched: {exc}") from exc
    spec = EnvironmentSpec(python=pinned, source=f"synth: {package}'s test dependencies")
    return spec, {"declared": declared.requirements, "read_from": declared.sources, "dropped": declared.dropped}


def synthesize(
    package_dir: Path | None = None,
    requirement: str | None = None,
    out_dir: Path = Path("synth-tasks"),
    max_tasks: int = 5,
    max_candidates: int = 60,
    seed: int = 0,
    p2p_sample: int | None = None,
    split: str = "train",
    runner: TestRunner = run_tests,
    one_per_function: bool = True,
) -> SynthReport:
    """Make up to `max_tasks` tasks; see the module docstring. Give `package_dir` or `requirement`.

    With the default runner the suite runs in a host venv holding the package's own test dependencies; another
    runner runs it wherever it likes, and the tasks still declare those dependencies."""
    if (package_dir is None) == (requirement is None):
        raise SynthError("give exactly one of a package directory or a PyPI requirement NAME==VERSION")
    with tempfile.TemporaryDirectory(prefix="lego-synth-") as tmp:
        work = Path(tmp)
        root = download_sdist(requirement, work / "download") if requirement else Path(package_dir).resolve()
        if not root.is_dir():
            raise SynthError(f"package directory {root} does not exist")
        package, version = _package_identity(root, requirement)
        repo = work / "repo"
        init_repo(repo)
        _copy_source(root, repo)
        pristine = commit_all(repo, f"{package} {version}: pristine source", PRISTINE_DATE)
        spec, dependencies = _environment_of(root, package)
        python = None
        if runner is run_tests:
            try:
                python = str(test_python(spec.python))
            except PackageFetchError as exc:
                raise SynthError(str(exc)) from exc
            venv_python = python

            def runner(repo_dir: Path, test_ids: list[str] | None = None) -> dict[str, str]:
                return run_tests(repo_dir, test_ids, python=venv_python)

        baseline, _ = _statuses(runner, repo, python)
        # A parametrized id with a space is cut at the space by the -rA parsers (ours and swebench's):
        # such ids can collide, so they are never used as FAIL_TO_PASS or PASS_TO_PASS.
        passing = sorted(t for t, s in baseline.items() if s == PASSED and ("[" not in t or t.endswith("]")))
        if not passing:
            raise SynthError(
                f"no test of {package} passes before any mutation (statuses: {dict(list(baseline.items())[:5])}); "
                "the package's tests must run with `python -m pytest` from its source root"
            )
        report = SynthReport([], None, None, package, version)
        candidates: list[Mutation] = []
        for rel in candidate_files(repo):
            candidates += find_mutations(rel.as_posix(), (repo / rel).read_bytes())
        if not candidates:
            raise SynthError(f"found nothing to mutate in {package}: no function bodies outside its tests")

        kept = _detected_mutations(candidates, repo, runner, python, passing, report, max_tasks=max_tasks,
                                   max_candidates=max_candidates, seed=seed, p2p_sample=p2p_sample,
                                   one_per_function=one_per_function)
        if not kept:
            raise SynthError(
                f"none of {report.candidates_tried} mutations of {package} made a passing test fail; raise "
                "max_candidates or pick a package whose tests check its behaviour more closely"
            )
        tasks = _commit_tasks(repo, pristine, package, version, kept, seed, split, spec, dependencies, p2p_sample)
        out_dir = Path(out_dir)
        bundle_file = bundle(repo, out_dir / "repos" / f"{_safe(package)}.bundle")
        report.tasks = _check_from_bundle(tasks, bundle_file, work / "check", runner, report)
        report.bundle_file = bundle_file
        report.tasks_file = out_dir / "tasks.jsonl"
        report.tasks_file.write_text("".join(
            json.dumps(task.model_dump(mode="json", exclude_none=True), sort_keys=True) + "\n" for task in report.tasks
        ))
        return report


def _detected_mutations(candidates: list[Mutation], repo: Path, runner: TestRunner, python: str | None,
                        passing: list[str], report: SynthReport, *, max_tasks: int, max_candidates: int, seed: int,
                        p2p_sample: int | None, one_per_function: bool
                        ) -> list[tuple[Mutation, list[str], list[str], str]]:
    """The mutations, tried in a seeded order, that make a passing test fail while most of the suite still runs,
    each with its FAIL_TO_PASS, PASS_TO_PASS and problem statement; `report` counts what was tried and why the
    others were left."""
    rng = random.Random(seed)
    kept: list[tuple[Mutation, list[str], list[str], str]] = []
    used_functions: set[tuple[str, str]] = set()
    for mutation in shuffled(candidates, seed):
        if len(kept) >= max_tasks or report.candidates_tried >= max_candidates:
            break
        if one_per_function and (mutation.file, mutation.function) in used_functions:
            continue
        report.candidates_tried += 1
        path = repo / mutation.file
        pristine_bytes = path.read_bytes()
        path.write_bytes(mutation.apply(pristine_bytes))
        try:
            mutated, log = _statuses(runner, repo, python)
        finally:
            path.write_bytes(pristine_bytes)
        if len(mutated) < len(passing) / 2:
            report.rejected.append(f"{mutation.description}: most tests did not run (import error or timeout)")
            continue
        fail_to_pass = sorted(t for t in passing if mutated.get(t) in ("FAILED", "ERROR"))
        if not fail_to_pass:
            report.undetected += 1
            continue
        still = [t for t in passing if mutated.get(t) == PASSED]
        pass_to_pass = sorted(still if p2p_sample is None else rng.sample(still, min(p2p_sample, len(still))))
        statement = problem_statement(report.package, fail_to_pass, _failure_messages(log))
        kept.append((mutation, fail_to_pass, pass_to_pass, statement))
        used_functions.add((mutation.file, mutation.function))
    return kept


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name)


def _commit_tasks(repo: Path, pristine: str, package: str, version: str,
                  kept: list[tuple[Mutation, list[str], list[str], str]], seed: int, split: str,
                  spec: EnvironmentSpec, dependencies: dict, p2p_sample: int | None) -> list[Task]:
    tasks = []
    for number, (mutation, fail_to_pass, pass_to_pass, statement) in enumerate(kept, 1):
        task_id = f"{_safe(package)}-{number:03d}"
        git(repo, "checkout", "-q", "-B", f"task/{task_id}", pristine)
        path = repo / mutation.file
        path.write_bytes(mutation.apply(path.read_bytes()))
        base_commit = commit_all(repo, f"{package}: update {mutation.file}", MUTATION_DATE)
        git(repo, "checkout", "-q", pristine, "--", mutation.file)
        patch = diff(repo, [mutation.file])
        git(repo, "checkout", "-q", base_commit, "--", mutation.file)
        tasks.append(Task(
            instance_id=f"lego-synth__{task_id}",
            repo=f"lego-synth/{_safe(package)}",
            base_commit=base_commit,
            problem_statement=statement,
            patch=patch,
            test_patch="",
            FAIL_TO_PASS=fail_to_pass,
            PASS_TO_PASS=pass_to_pass,
            version=version,
            environment_setup_commit=base_commit,
            created_at=MUTATION_DATE,
            split=split,
            difficulty="easy" if mutation.operator in ("off_by_one", "boundary_comparison", "flip_comparison") else "medium",
            environment={"kind": "bundle", "bundle": f"repos/{_safe(package)}.bundle", "workdir": "/repo",
                         "requires": spec if not spec.empty else None},
            provenance={
                "source": "synth", "package": package, "version": version, "file": mutation.file,
                "function": mutation.function, "operator": mutation.operator, "line": mutation.lineno,
                "original": mutation.original, "mutated": mutation.replacement, "seed": seed,
                "pristine_commit": pristine, "test_dependencies": dependencies,
                # PASS_TO_PASS is the whole passing suite unless a sample was asked for: then it says so.
                **({"pass_to_pass_sample": {"size": p2p_sample, "seed": seed}} if p2p_sample is not None else {}),
            },
        ))
    git(repo, "checkout", "-q", "main")
    return tasks


def _check_from_bundle(tasks: list[Task], bundle_file: Path, work: Path, runner: TestRunner,
                       report: SynthReport) -> list[Task]:
    good = []
    for task in tasks:
        checkout = clone(bundle_file, work / task.instance_id, task.base_commit)
        with_bug = runner(checkout, task.FAIL_TO_PASS)
        if any(with_bug.get(t) == PASSED for t in task.FAIL_TO_PASS):
            report.rejected.append(f"{task.instance_id}: FAIL_TO_PASS passes at base_commit (flaky?)")
            continue
        apply_patch(checkout, task.patch)
        fixed = runner(checkout, task.FAIL_TO_PASS + task.PASS_TO_PASS)
        not_passing = [t for t in task.FAIL_TO_PASS + task.PASS_TO_PASS if fixed.get(t) != PASSED]
        if not_passing:
            report.rejected.append(f"{task.instance_id}: with the gold patch {not_passing[:3]} do not pass")
            continue
        good.append(task)
    return good
