"""The grading supervisor: `python3 -I /opt/lego-grader/lego_grade.py SPEC_FILE` inside a fresh grading sandbox.

Standard library and the image's pytest only. The supervisor never runs a line of the repository's code:
it loads pytest and its whole import closure from the system paths (isolated mode: no cwd, no PYTHON*
variables, no user site), makes itself undumpable (so no process of the same uid can read its memory or
reach its file descriptors through /proc), reads the pytest configuration of the pristine and of the patched
repository with pytest's own resolution, and then forks one interpreter per run — the whole test files once,
and each FAIL_TO_PASS test alone — each in its own session, with its output going to a log file and its
results coming back only through a pipe of its own. The supervisor observes every child from outside
(exit status by waitpid, signals, its memory cgroup's OOM kills, wall clock) and prints one JSON line,
prefixed with RESULT_MARKER, on the exec stream, which no child holds.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import types

RESULT_MARKER = "LEGO_GRADE_RESULT "
HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = "lego_grade_runner"  # the package the runner's multi-file modules are loaded in (load_package_module)
SCRATCH = "/tmp/lego-grade"
CONFIG_CANDIDATES = ("pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")
OOM_EVENTS = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")
LOG_TAIL = 24_000
MAX_RECORDS = 200_000  # a suite of tens of thousands of tests sends a few records each


def load(name: str, filename: str | None = None):
    path = os.path.join(HERE, filename or f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_package_module(name: str):
    """A runner module that imports its parts relatively (defeaters.py and its defeaters_*.py), as a module of a
    package whose only path is this directory: its parts resolve from here, never from sys.path, where the
    repository could put a module of the same name. The package's name keeps the runner's prefix, so the guard
    and the fingerprints treat its modules as the runner's own."""
    package = sys.modules.get(PACKAGE)
    if package is None:
        package = types.ModuleType(PACKAGE)
        package.__path__ = [HERE]
        sys.modules[PACKAGE] = package
    return load(f"{PACKAGE}.{name}", f"{name}.py")


def undumpable() -> bool:
    """PR_SET_DUMPABLE=0: /proc/<pid>/{mem,fd,environ} become root's and ptrace is refused to our own uid."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE
    except Exception:
        return False


def preimport_runner() -> list[str]:
    import pkgutil

    import _pytest
    import pytest  # noqa: F401

    failed = []
    for module in pkgutil.walk_packages(_pytest.__path__, "_pytest."):
        try:
            __import__(module.name)
        except Exception:
            failed.append(module.name)
    for name in ("pluggy", "iniconfig", "packaging.version", "json", "ast", "tokenize", "pdb", "doctest",
                 "unittest", "xml.etree.ElementTree", "shlex", "tempfile"):
        try:
            __import__(name)
        except Exception:
            failed.append(name)
    return failed


def oom_kills() -> int:
    for path in OOM_EVENTS:
        try:
            with open(path) as handle:
                for line in handle:
                    if line.startswith("oom_kill "):
                        return int(line.split()[1])
        except OSError:
            continue
    return 0


# ---------------------------------------------------------------------------------------------- configuration


def config_view(root: str, test_args: list[str], overlay_patch: str | None = None) -> dict:
    """What pytest would use as rootdir, ini file and ini values for these test paths, judged by pytest's own
    resolution on a skeleton of the tree (the config files on the test paths' ancestor directories)."""
    from _pytest.config.findpaths import determine_setup

    skeleton = tempfile.mkdtemp(prefix="config-", dir=SCRATCH)
    directories = {""}
    for arg in test_args:
        parent = os.path.dirname(arg.split("::")[0])
        while parent:
            directories.add(parent)
            parent = os.path.dirname(parent)
    for directory in directories:
        os.makedirs(os.path.join(skeleton, directory), exist_ok=True)
        for name in (*CONFIG_CANDIDATES, "setup.py"):
            source = os.path.join(root, directory, name)
            if os.path.isfile(source) and not os.path.islink(source):
                shutil.copyfile(source, os.path.join(skeleton, directory, name))
    args = []
    for arg in test_args:
        path = os.path.join(skeleton, arg.split("::")[0])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if not os.path.exists(path):
            open(path, "w").close()
        args.append(path)
    if overlay_patch:
        patch_file = os.path.join(skeleton, ".lego-overlay.patch")
        with open(patch_file, "w") as handle:
            handle.write(overlay_patch)
        includes = [f"--include={d + '/' if d else ''}{name}" for d in directories for name in CONFIG_CANDIDATES]
        subprocess.run(["git", "apply", "--whitespace=nowarn", *includes, patch_file], cwd=skeleton,
                       capture_output=True)
        os.unlink(patch_file)
    try:
        rootdir, inipath, inicfg = determine_setup(None, args)
        view = {"rootdir": os.path.relpath(str(rootdir), skeleton),
                "inifile": os.path.relpath(str(inipath), skeleton) if inipath else None,
                "ini": {key: value if isinstance(value, str | list) else str(value) for key, value in dict(inicfg).items()}}
    except Exception as exc:  # pytest refuses the configuration: that is what it does, so it is compared too
        view = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    shutil.rmtree(skeleton, ignore_errors=True)
    return view


def plugin_modules() -> list[str]:
    """Entry-point plugins of the environment, found before the repository is on sys.path."""
    from importlib.metadata import entry_points

    return sorted({ep.module for ep in entry_points(group="pytest11")})


def protected_files(repo: str, test_args: list[str], extra: list[str] = ()) -> list[str]:
    """What defines the tests: the test files, every file the test patch adds or changes (helpers and data
    included), every conftest.py, the pytest configuration files on their ancestor directories, and the bytecode
    caches beside the test files (a cached module is what gets run)."""
    found: set[str] = {os.path.join(repo, path) for path in extra}
    for arg in test_args:
        path = os.path.join(repo, arg.split("::")[0])
        found.add(path)
        directory = os.path.dirname(path)
        found.add(os.path.join(directory, "__pycache__"))
        while directory.startswith(repo.rstrip("/")):
            found.update(os.path.join(directory, name) for name in CONFIG_CANDIDATES)
            found.add(os.path.join(directory, "conftest.py"))
            if directory == repo.rstrip("/"):
                break
            directory = os.path.dirname(directory)
    for directory, subdirectories, files in os.walk(repo):
        subdirectories[:] = [d for d in subdirectories if d not in (".git", "__pycache__")]
        if "conftest.py" in files:
            found.add(os.path.join(directory, "conftest.py"))
    return sorted(found)


def file_state(paths: list[str]) -> dict[str, str]:
    """Content of each protected path (a directory: its entries and theirs); absent paths count as absent."""
    state: dict[str, str] = {}
    for path in paths:
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                for entry in sorted(os.listdir(path)):
                    state.update(file_state([os.path.join(path, entry)]))
                state[path] = "dir"
            elif os.path.islink(path):
                state[path] = "link:" + os.readlink(path)
            elif os.path.exists(path):
                with open(path, "rb") as handle:
                    state[path] = hashlib.sha256(handle.read()).hexdigest()
        except OSError as exc:
            state[path] = f"unreadable: {exc.strerror}"
    return state


def changed_files(before: dict[str, str], after: dict[str, str]) -> list[str]:
    return sorted(path for path in before.keys() | after.keys() if before.get(path) != after.get(path))


# ---------------------------------------------------------------------------------------------- children


def run_child(name: str, args: list[str], timeout: float, spec: dict, ctx: dict) -> dict:
    log_path = os.path.join(SCRATCH, f"{name}.log")
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    before = oom_kills()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 3
        try:
            os.close(read_end)
            code = child(args, write_end, log_path, spec, ctx)
        except BaseException:
            code = 3
        finally:
            ctx["tamper"].real_exit(code)
    os.close(write_end)
    records, timed_out, status = collect(read_end, pid, timeout)
    os.close(read_end)
    try:
        os.killpg(pid, signal.SIGKILL)  # whatever the run left behind in its session
    except OSError:
        pass
    result = summarize(records, pid)
    result.update(name=name, seconds=round(time.monotonic() - started, 3), timed_out=timed_out,
                  oom_kills=oom_kills() - before, log_tail=tail(log_path))
    # The tests' own files are the task's: a run that changed them (a test file rewritten for the runs that
    # follow, a poisoned bytecode cache, a conftest removed) tampered with grading, whoever did it.
    after = file_state(ctx["protected"])
    changed = changed_files(ctx["protected_state"], after)
    if changed:
        result["tamper"].append(f"the tests' own files changed during the run: {', '.join(changed[:6])}")
        ctx["protected_state"] = after
    if status is not None:
        code = os.waitstatus_to_exitcode(status)
        result["exit_code"] = 128 - code if code < 0 else code  # killed by signal N: 128+N, as a shell says
    return result


def collect(read_end: int, pid: int, timeout: float):
    """Read the run's records until it exits (and a moment more), or until its time is up; never block on it."""
    deadline = time.monotonic() + timeout
    buffer = b""
    records: list[dict] = []
    status = None
    exited_at = None
    open_channel = True
    while True:
        now = time.monotonic()
        if status is None:
            done, waited = os.waitpid(pid, os.WNOHANG)
            if done:
                status, exited_at = waited, now
        if exited_at is not None and (not open_channel or now - exited_at > 1.0):
            break  # a process the run left behind may keep the pipe open: what it writes later does not count
        if now > deadline:
            break
        if not open_channel:
            time.sleep(0.02)
            continue
        ready, _, _ = select.select([read_end], [], [], 0.05)
        if not ready:
            continue
        chunk = os.read(read_end, 1 << 16)
        if not chunk:
            open_channel = False  # every writer closed it; the run itself may still be going
            continue
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if len(records) >= MAX_RECORDS:
                records.append({"t": "tamper", "detail": f"the run flooded its result channel (over {MAX_RECORDS} records)"})
                open_channel = False
                break
            try:
                records.append(json.loads(line))
            except ValueError:
                records.append({"t": "garbled", "detail": line[:200].decode(errors="replace")})
    timed_out = status is None
    if timed_out:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:
            status = None
    return records, timed_out, status


def passed_in(run: dict, test: str) -> bool:
    """Whether `test` passed in `run` as the grader judges it (`grader.status_of_test`): every phase observed to
    end ok and pytest reporting it passed. The runner does not know which test of a group is real: a group whose
    tests all failed cannot hold a passing real test, so its alone run would decide nothing."""
    entry = run.get("tests", {}).get(test)
    if not entry:
        return False
    ours = {when: states[-1] for when, states in entry.get("ours", {}).items()}
    reported = {when: outcomes[-1] for when, outcomes in entry.get("pytest", {}).items()}
    return (all(ours.get(when) == "ok" for when in ("setup", "call", "teardown")) and bool(reported)
            and all(outcome == "passed" for outcome in reported.values()) and reported.get("call") == "passed")


def summarize(records: list[dict], pid: int) -> dict:
    tests: dict[str, dict] = {}
    result: dict = {"tests": tests, "tamper": [], "defeaters": [], "suspicions": [], "collect_errors": [],
                    "collected": None,
                    "end_rc": None, "foreign_records": 0}
    for record in records:
        kind = record.get("t")
        if kind in ("tamper", "defeater"):
            (result["defeaters"] if kind == "defeater" else result["tamper"]).append(str(record.get("detail"))[:500])
            continue
        if kind == "suspect":  # something honest code also does: evidence, never a verdict
            if len(result["suspicions"]) < 50:
                result["suspicions"].append(str(record.get("detail"))[:300])
            continue
        if kind == "garbled":  # nothing a test needs to pass; kept as evidence, not held against anyone
            result["garbled"] = result.get("garbled", 0) + 1
            continue
        if record.get("pid") != pid:
            result["foreign_records"] += 1  # only the run's own process speaks for its tests
            continue
        if kind == "phase":
            tests.setdefault(record["id"], {"ours": {}, "pytest": {}})["ours"].setdefault(record["when"], []).append(
                record["state"])
        elif kind == "report":
            tests.setdefault(record["id"], {"ours": {}, "pytest": {}})["pytest"].setdefault(record["when"], []).append(
                record["outcome"])
            if record.get("reason"):
                tests[record["id"]]["skip_reason"] = str(record["reason"])[:300]
        elif kind == "interrupted":
            result["interrupted"] = str(record.get("detail"))[:300]
        elif kind == "collected":
            result["collected"] = record["ids"]
        elif kind == "collect_skip":
            result.setdefault("collect_skips", {})[str(record.get("id"))] = str(record.get("reason", ""))[:300]
        elif kind == "collect_error":
            result["collect_errors"].append(f"{record.get('id')}: {record.get('detail', '')[-300:]}")
        elif kind == "end":
            result["end_rc"] = record.get("rc")
            if record.get("error"):
                result["runner_error"] = record["error"]
    return result


def tail(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - LOG_TAIL))
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def child(args: list[str], channel: int, log_path: str, spec: dict, ctx: dict) -> int:
    os.setsid()
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    # The channel moves to a random descriptor (a forger has to search for it) and the exec stream and every
    # other descriptor of the supervisor are gone before the repository loads.
    moved = 300 + int.from_bytes(os.urandom(2), "little") % 700
    os.dup2(channel, moved)
    os.close(channel)
    channel = moved
    for fd in range(3, 1024):
        if fd != channel:
            try:
                os.close(fd)
            except OSError:
                pass
    import pytest

    tamper, guard, plugin_module = ctx["tamper"], ctx["guard"], ctx["plugin_module"]
    tamper.runner_pids = {os.getpid(), os.getppid()}
    fingerprint = ctx["fingerprints"].Fingerprint(("_pytest", "pytest", "pluggy", "iniconfig", "lego_grade"),
                                                   guard.code_of)
    graded = frozenset(spec["graded"])
    plugin, emit = plugin_module.make_plugin(channel, fingerprint, tamper, ctx["sources"], ctx["operand_ignored"],
                                             guard.keep_first, ctx["finder"], graded)
    # The audit hook is inherited from the supervisor: in this run it reports through this run's channel.
    tamper.report = lambda kind, detail: emit({"t": kind, "detail": detail})
    sys.dont_write_bytecode = True  # so that any bytecode cache appearing beside a test file is somebody's doing
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    os.environ.pop("PYTEST_ADDOPTS", None)
    os.chdir(spec["repo"])
    sys.path.insert(0, spec["repo"])  # as `python -m pytest` does; protected names still resolve as before
    # The task's own variables (isolated mode ignores PYTHON*: its PYTHONPATH entries go on sys.path here).
    env = dict(spec.get("env") or {})
    for entry in reversed([e for e in env.pop("PYTHONPATH", "").split(os.pathsep) if e]):
        sys.path.insert(1, os.path.join(spec["repo"], entry))
    os.environ.update(env)
    tamper.enabled = True
    try:
        rc = int(pytest.main(args, plugins=[plugin]))
        emit({"t": "end", "rc": rc})
    except BaseException as exc:  # noqa: BLE001 - reported, then the supervisor decides
        rc = 3
        emit({"t": "end", "rc": rc, "error": f"{type(exc).__name__}: {exc}"[:500]})
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass
    return rc


def patched_sources(spec: dict, repo: str, pristine: str, defeaters) -> tuple[dict[str, str], list[str]]:
    """The patch's own Python files, read now, before any of its code can run and rewrite them, and the
    assertion defeaters they define that the pristine files did not."""
    sources: dict[str, str] = {}
    static: list[str] = []
    for relative in spec.get("patched_files", []):
        path = os.path.join(repo, relative)
        if not relative.endswith(".py") or not os.path.isfile(path) or os.path.islink(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as handle:
            sources[path] = handle.read()
        if defeaters is not None:
            # What the pristine file already defined is the repository's own (a wildcard it always had), not the patch's.
            before = set()
            pristine_path = os.path.join(pristine, relative)
            if os.path.isfile(pristine_path) and not os.path.islink(pristine_path):
                with open(pristine_path, encoding="utf-8", errors="replace") as handle:
                    before = {(f.kind, f.detail) for f in defeaters.defeaters_in_source(pristine_path, handle.read())}
            for finding in defeaters.defeaters_in_source(path, sources[path]):
                if (finding.kind, finding.detail) not in before:
                    static.append(f"{finding.path}:{finding.line}: {finding.kind}: {finding.detail}")
    return sources, static


# ---------------------------------------------------------------------------------------------- main


def main() -> None:
    with open(sys.argv[1], "rb") as handle:
        spec = json.loads(handle.read())
    os.unlink(sys.argv[1])
    os.makedirs(SCRATCH, exist_ok=True)
    trusted_path = [entry for entry in sys.path if entry]
    report: dict = {"version": 1, "undumpable": undumpable(), "preimport_failed": preimport_runner()}
    guard = load("lego_grade_guard")
    fingerprints = load("lego_grade_fingerprint")
    plugin_module = load("lego_grade_plugin")
    try:
        defeaters = load_package_module("defeaters")
    except Exception as exc:
        defeaters = None
        report["defeaters_error"] = f"{type(exc).__name__}: {exc}"
    repo, pristine = spec["repo"], spec["pristine"]
    test_args = list(spec["test_files"])
    report["config"] = {"pristine": config_view(pristine, test_args, spec.get("config_overlay_patch")),
                        "graded": config_view(repo, test_args)}
    report["plugins"] = plugin_modules()
    sources, static = patched_sources(spec, repo, pristine, defeaters)
    report["static_defeaters"] = static

    def operand_ignored(source: str, line: int, name: str, method: str):
        """Does this function, attached to a class as `method` (however it got there), defeat assertions?"""
        if defeaters is None:
            return None
        try:
            return defeaters.function_defeats(source, line, name, method)
        except Exception:
            return None

    finder = guard.install_import_guard(trusted_path, repo, pristine)
    tamper = guard.Tamper(set(sources) | {os.path.join(repo, p) for p in spec.get("patched_files", [])},
                          lambda kind, detail: None, trusted_path, repo,
                          patched_lines=spec.get("patched_lines") or None, pristine_root=pristine)
    ctx = {"guard": guard, "fingerprints": fingerprints, "plugin_module": plugin_module, "tamper": tamper, "finder": finder, "sources": sources,
           "operand_ignored": operand_ignored}
    # One line per failure, after the task's own arguments: decoys fail by design, and pytest's long and short
    # tracebacks parse each frame's whole module again (a decoy-laden test file, per frame, per failure), which
    # made a plan's gold runs on a suite with deep tracebacks (schema's) nearly all traceback formatting.
    base_args = ["-p", "no:cacheprovider", "-rA", *sum((["-p", m] for m in report["plugins"]), []),
                 *spec.get("pytest_args", []), "--tb=line"]
    ctx["protected"] = protected_files(repo, test_args, spec.get("protected", []))
    ctx["protected_state"] = file_state(ctx["protected"])
    tamper.install()
    runs = []
    # The test files, or only the tests named in `select` (a decoy plan runs the planned tests, not whole suites).
    selected = list(spec.get("select") or test_args)
    for index in range(spec.get("full_runs", 1)):
        runs.append(run_child("full" if index == 0 else f"full-{index + 1}", [*base_args, *selected],
                              spec["timeout_s"], spec, ctx))
    # Each group alone can only confirm a resolution: when a group has no passing test in the full run, its real
    # test failed and the patch resolves nothing, so no group is run alone (one interpreter per group).
    groups = spec.get("groups", [])
    unpassed = next((group for group in groups if not any(passed_in(runs[0], test) for test in group)), None)
    if unpassed is not None:
        report["alone_skipped"] = f"no test of the group {', '.join(unpassed[:3])} passed in the full run"
    elif not runs[0]["timed_out"]:
        for index in spec.get("alone", []):
            runs.append(run_child(f"alone-{index}", [*base_args, *groups[index]], spec["timeout_s"], spec, ctx))
            runs[-1]["group"] = groups[index]
            if runs[-1]["timed_out"]:
                break
    report["runs"] = runs
    sys.stdout.write("\n" + RESULT_MARKER + json.dumps(report) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
