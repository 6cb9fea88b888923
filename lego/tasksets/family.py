"""Procedurally generated task families: many small SWE-style tasks that share one skill, for measuring
generalization rather than memorization (issue 33).

A family task's fix depends on what its problem statement says: which file, which function and which line. The
held-out split shares the family's skill but not its surface, so a policy that ignores the statement (or that
memorized the training tasks) cannot pass it.

`family:constants` is a tiny Python package `appconf` of modules of small functions that return or use an integer
constant. Each task plants one wrong constant in one function of a module of its own; the statement names the file,
the function's `def` and its right return line (phrased from a few templates); the gold patch fixes that one line;
the hidden test file (tests/test_fix.py, the test_patch) checks it (FAIL_TO_PASS) and pins the module's two other
functions (PASS_TO_PASS, with the module's visible tests and another module's). The split:
- train tasks live in the train modules, held-out ("eval") tasks in other modules that only the held-out tasks'
  repository has: disjoint files, (module, function) pairs and function names;
- every function has its own value, so the held-out fixes' values are disjoint from the training ones;
- one task per module, so no two tasks share a file name: a policy that cannot copy a file name it never wrote fails
  one task for it, not every task of a module, and the held-out rate counts as many independent file names as tasks.
The whole family is one git repository: a pristine commit with the train modules, one on top adding the held-out
modules, and one commit per task planting its bug; fixed dates make the hashes the same on every machine.

Each task also carries `provenance["gold_command"]`: a shell command that makes the gold patch's change from what
the statement names alone (`gold_command`); the warm start demonstrates it rather than the gold patch, which holds
what no statement gives (the wrong value).

Loaded by `lego.tasksets.load.load_tasks("family:constants")` (or "family:constants:SEED", or with sizes,
"family:constants:SEED:TRAIN+HELD_OUT"); built once into the machine cache under a key of (name, seed, sizes, this
file's source), so loading again is instant.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from lego.cache import cache_dir
from lego.tasksets.gitutil import bundle, commit_all, diff, git, init_repo
from lego.tasksets.task import Task, TaskSetError

TRAIN_SPLIT = "train"
HELD_OUT_SPLIT = "eval"  # the split name the configs use for held-out tasks (tasks.eval_split, eval.splits)
PACKAGE = "appconf"
FIX_TEST_FILE = "tests/test_fix.py"
FUNCTIONS_PER_MODULE = 3  # the task's target and the two functions its hidden tests pin
PRISTINE_DATE = "2024-01-01T00:00:00+00:00"
HELD_OUT_DATE = "2024-01-01T12:00:00+00:00"
BUG_DATE = "2024-01-02T00:00:00+00:00"
REPOS_SUBDIR = "repos"
DEFAULT_TRAIN = 64  # the "at least 64 training tasks and 32 held-out tasks"
DEFAULT_HELD_OUT = 32

# A module per task: as many names as the family can have tasks. Common words of an application's parts, so that
# their tokens are ordinary ones (a file name of one to three tokens).
_MODULES = tuple("""
    billing network storage render audio cache auth search upload queue mailer report scheduler metrics gateway
    ledger inventory profile session thumbnail export backup checkout pricing payments orders catalog shipping
    invoices alerts tracking captcha webhooks tokens sitemap locale avatar comments feeds ratings coupons banners
    routing logging tenants plugins themes widgets vendors wallet loyalty refunds surveys badges polls calendar
    tickets forms media assets firewall vault licenses invites groups teams roles policies printer camera sensor
    router modem tablet keyboard monitor speaker battery charger scanner projector antenna cable adapter display
    webcam headset stylus console gamepad joystick remote lamp thermostat doorbell meter valve pump motor engine
    brake clutch pedal wheel mirror radio compiler parser lexer linker loader kernel driver shell editor terminal
    browser crawler indexer ranker tagger planner tracker notifier importer archiver resizer encoder decoder mixer
    player recorder streamer
    account address agenda album anchor archive atlas badge basket beacon binder blender blog bookmark bridge
    broker bucket budget builder bundle button cabinet canvas carousel cart cashier channel chart chat checker
    cipher clock cluster coach collector column compass composer counter courier crane credit cursor dashboard
    dealer debugger deck desk diary digest dispatcher dock domain drawer dryer elevator emailer emitter
    escrow event faucet fence folder font forecast fountain freezer funnel furnace gallery garage garden
    gauge glossary grader graph grid guard handler harbor heater helmet hub icon inbox journal kettle kiosk
    label ladder launcher layout lens library locker lottery mailbox manifest marker market matcher menu
    message mill minter modal mosaic notebook oven packer palette panel parcel passport patcher pager payroll
    pencil picker pipeline pixel planter playlist pointer portal poster presenter prompt puzzle quiz ranch
    reader receipt registry relay renderer resolver review ribbon robot rocket sandbox satellite scale schema
    screen scroll seeker selector sender server signal slider snapshot socket solver sorter spinner splitter
    sprite stadium stamp station sticker stove studio switch syncer table tape teller template ticker timer
    toaster toolbar tooltip tower trader trailer translator tunnel tutor uploader validator viewer voter
    wagon watcher weather wizard writer zipper""".split())
_QUALIFIERS = ("default", "max", "min", "base", "initial", "fallback", "target", "peak", "idle", "spare", "grace",
               "burst", "soft", "hard", "extra", "local", "upper", "lower", "nominal", "reserve", "warm", "cold",
               "early", "late", "daily", "weekly", "primary", "secondary", "mean", "total", "safe", "quick")
_NOUNS = ("timeout", "retries", "port", "width", "height", "batch", "depth", "ratio", "limit", "threshold",
          "interval", "workers", "buffer", "quota", "window", "delay", "size", "count", "offset", "margin",
          "capacity", "rate", "step", "scale", "level", "span", "gap", "weight", "priority", "cutoff")
_VALUES = range(2, 1000)  # every function's right value is its own
# What a function does with its constant: (signature, body, test call, expected). The statement gives the right
# body, so the fix is the statement's line in the statement's function of the statement's file.
_KINDS = {
    "returns": ("()", "return {v}", "{fn}()", "{v}"),
    "scales": ("(count)", "return count * {v}", "{fn}(3)", "3 * {v}"),
    "caps": ("(value)", "return min(value, {v})", "{fn}(10**6)", "{v}"),
    "offsets": ("(value)", "return value + {v}", "{fn}(5)", "5 + {v}"),
}
# Each names the file as a path, the function by its `def` line and the right line as code, as a bug report quoting
# the code would: the reply's fix writes the same three pieces after the same words (`appconf`, `def`, `return`).
_STATEMENTS = (
    "In `{path}`, `def {fn}{signature}` is wrong: it should `{body}`.\n",
    "Bug in `{path}`: `def {fn}{signature}` must `{body}`, as documented. The other functions are right.\n",
    "Please fix `def {fn}{signature}` in `{path}` so that it does `{body}`; leave the other functions as they "
    "are.\n",
    "`def {fn}{signature}` (in `{path}`) uses the wrong number: it should `{body}` instead.\n",
)


class FamilyFunction(BaseModel):
    """One function of the generated package: its module, name, kind and right value."""

    model_config = ConfigDict(frozen=True)

    module: str
    name: str
    kind: str
    value: int


class FamilyPlan(BaseModel):
    """What a seed draws: the modules of each split, every function, and the tasks (target, wrong value)."""

    train_modules: list[str]
    held_out_modules: list[str]
    functions: list[FamilyFunction]
    tasks: list[tuple[str, FamilyFunction, int, int]]  # (split, target, wrong value, statement template)


def _plan(seed: int, train: int, held_out: int) -> FamilyPlan:
    """Draw the family's surface for a seed; every choice comes from one seeded generator, in a fixed order. A task
    per module: the first `train` modules hold the training tasks, the next `held_out` the held-out ones."""
    rng = random.Random(f"family:constants:{seed}")
    names = [f"{q}_{n}" for q in _QUALIFIERS for n in _NOUNS]
    n_modules = train + held_out
    n_functions = n_modules * FUNCTIONS_PER_MODULE
    values_left = len(_VALUES) - 1  # at least one value no function has, for the planted bugs
    if n_modules > len(_MODULES) or n_functions > min(len(names), values_left):
        most = min(len(_MODULES), min(len(names), values_left) // FUNCTIONS_PER_MODULE)
        raise TaskSetError(f"family:constants has at most {most} tasks in all (asked for {train} training and "
                           f"{held_out} held-out); ask for fewer")
    modules = rng.sample(_MODULES, n_modules)
    names = rng.sample(names, n_functions)
    values = rng.sample(_VALUES, n_functions)
    kinds = sorted(_KINDS)
    functions = [FamilyFunction(module=modules[i // FUNCTIONS_PER_MODULE], name=names[i], kind=rng.choice(kinds),
                                value=values[i]) for i in range(n_functions)]
    unused = sorted(set(_VALUES) - set(values))  # a wrong value is no function's right one
    tasks = []
    for index, module in enumerate(modules):
        target = rng.choice([f for f in functions if f.module == module])
        wrong = rng.choice(unused)
        tasks.append((TRAIN_SPLIT if index < train else HELD_OUT_SPLIT, target, wrong, rng.randrange(len(_STATEMENTS))))
    return FamilyPlan(train_modules=modules[:train], held_out_modules=modules[train:], functions=functions,
                      tasks=tasks)


# ---------------------------------------------------------------- the repository's files


def _module_source(module: str, functions: list[FamilyFunction], wrong: dict[str, int] | None = None) -> str:
    lines = [f'"""Settings of the {module} component."""', ""]
    for function in functions:
        signature, body = _KINDS[function.kind][:2]
        value = (wrong or {}).get(function.name, function.value)
        words = function.name.replace("_", " ")
        lines += ["", f"def {function.name}{signature}:", f'    """The {words} of {module}."""',
                  f"    {body.format(v=value)}", ""]
    return "\n".join(lines)


def _call(function: FamilyFunction, small: bool = False) -> str:
    call = _KINDS[function.kind][2].format(fn=function.name)
    return call.replace("(10**6)", "(3)").replace("(5)", "(3)") if small else call


def _visible_tests(module: str, functions: list[FamilyFunction]) -> str:
    """The module's own tests: they check what every function returns is a positive int, not which one."""
    calls = [f"{module}.{_call(f, small=True)}" for f in functions]
    return "\n".join([f"from {PACKAGE} import {module}", "", "",
                      f"def test_{module}_settings_are_integers():",
                      *(f"    assert isinstance({c}, int)" for c in calls), "", "",
                      f"def test_{module}_settings_are_positive():",
                      *(f"    assert {c} > 0" for c in calls), ""])


def _pin(function: FamilyFunction) -> list[str]:
    expected = _KINDS[function.kind][3].format(v=function.value)
    return [f"def test_{function.name}():", f"    assert {function.module}.{_call(function)} == {expected}", "", ""]


def _write_modules(repo: Path, plan: FamilyPlan, modules: list[str]) -> None:
    for module in modules:
        functions = [f for f in plan.functions if f.module == module]
        (repo / PACKAGE / f"{module}.py").write_text(_module_source(module, functions))
        (repo / "tests" / f"test_{module}.py").write_text(_visible_tests(module, functions))


def _pristine(repo: Path, plan: FamilyPlan) -> tuple[str, str]:
    """The two pristine commits: the train modules, then the held-out modules added on top."""
    init_repo(repo)
    (repo / PACKAGE).mkdir()
    (repo / "tests").mkdir()
    (repo / PACKAGE / "__init__.py").write_text(f'"""{PACKAGE}: the settings of a small application."""\n')
    (repo / "README.md").write_text(f"# {PACKAGE}\n\nSettings of a small application, one module per component.\n"
                                    "Run the tests with `python -m pytest`.\n")
    _write_modules(repo, plan, plan.train_modules)
    train_commit = commit_all(repo, "Add the application settings", PRISTINE_DATE)
    _write_modules(repo, plan, plan.held_out_modules)
    return train_commit, commit_all(repo, "Add more components", HELD_OUT_DATE)


def _fix_tests(target: FamilyFunction, neighbours: list[FamilyFunction]) -> str:
    """The hidden test file: the target's value (FAIL_TO_PASS), then two neighbours' values (PASS_TO_PASS)."""
    lines = [f"from {PACKAGE} import {target.module}", "", ""]
    for function in [target, *neighbours]:
        lines += _pin(function)
    return "\n".join(lines).rstrip("\n") + "\n"


# ---------------------------------------------------------------- the tasks


def _body(function: FamilyFunction) -> str:
    return _KINDS[function.kind][1].format(v=function.value)


def _statement(target: FamilyFunction, template: int) -> str:
    return _STATEMENTS[template].format(fn=target.name, signature=_KINDS[target.kind][0], body=_body(target),
                                        path=f"{PACKAGE}/{target.module}.py")


def gold_command(path: str, function: str, body: str) -> str:
    """The demonstration's fix, built only from what the statement names (the file, the function, the right line):
    in `path`, on the lines from `def <function>` to the blank line after it, the return line becomes `body`. The
    gold patch holds more than the statement gives (the wrong value, neighbouring lines, the line numbers `git apply`
    checks), so a policy that learned to write it could not write a held-out task's fix; this command it can. It
    relies on what the generator writes: a blank line after every function, and `retu` only in its return line."""
    return f"sed -i '/def {function}/,/^$/s/retu.*/{body}/' {path} && git diff"


def _task_row(repo: Path, plan: FamilyPlan, index: int, parents: dict[str, str], seed: int) -> dict:
    """Commit one task's bug on its own branch and return its row (the bundle path relative to tasks.jsonl)."""
    split, target, wrong, template = plan.tasks[index]
    functions = [f for f in plan.functions if f.module == target.module]
    module_file = f"{PACKAGE}/{target.module}.py"
    git(repo, "checkout", "-q", "-B", f"task-{index:03d}", parents[split])
    (repo / module_file).write_text(_module_source(target.module, functions, {target.name: wrong}))
    base_commit = commit_all(repo, "Update settings", BUG_DATE)
    neighbours = [f for f in functions if f.name != target.name][:2]
    (repo / FIX_TEST_FILE).write_text(_fix_tests(target, neighbours))
    test_patch = diff(repo, [FIX_TEST_FILE])
    git(repo, "reset", "-q", "--", FIX_TEST_FILE)
    (repo / FIX_TEST_FILE).unlink()
    (repo / module_file).write_text(_module_source(target.module, functions))
    patch = diff(repo, [module_file])
    git(repo, "checkout", "-q", "--", module_file)
    pool = plan.train_modules if split == TRAIN_SPLIT else plan.held_out_modules
    other = pool[(pool.index(target.module) + 1) % len(pool)] if len(pool) > 1 else target.module
    visible = [f"tests/test_{target.module}.py::test_{target.module}_settings_are_{what}"
               for what in ("integers", "positive")]
    pass_to_pass = sorted({*(f"{FIX_TEST_FILE}::test_{f.name}" for f in neighbours), *visible,
                           f"tests/test_{other}.py::test_{other}_settings_are_integers"})
    return Task(
        instance_id=f"lego-family__constants-s{seed}-{index:03d}", repo=f"lego-family/constants-s{seed}",
        base_commit=base_commit, problem_statement=_statement(target, template), patch=patch,
        test_patch=test_patch, FAIL_TO_PASS=[f"{FIX_TEST_FILE}::test_{target.name}"], PASS_TO_PASS=pass_to_pass,
        environment_setup_commit=base_commit, created_at=BUG_DATE, split=split, difficulty="easy",
        environment={"kind": "bundle", "bundle": f"{REPOS_SUBDIR}/constants.bundle", "workdir": "/repo"},
        provenance={"source": "family", "family": "constants", "seed": seed, "module": target.module,
                    "function": target.name, "value": target.value, "wrong_value": wrong,
                    "fixed_files": [module_file], "test_files": [FIX_TEST_FILE],
                    # The Task model has no field for a solution written as a command (only `patch`, a diff), so the
                    # warm start's demonstrations take it from here (lego.pipeline.attempts.gold_command).
                    "gold_command": gold_command(module_file, target.name, _body(target))},
    ).model_dump(mode="json", exclude_none=True)


def _build_constants(out: Path, seed: int, train: int, held_out: int) -> None:
    """Write <out>/tasks.jsonl and <out>/repos/constants.bundle."""
    plan = _plan(seed, train, held_out)
    with tempfile.TemporaryDirectory(prefix="lego-family-") as tmp:
        repo = Path(tmp) / "constants"
        train_commit, held_out_commit = _pristine(repo, plan)
        parents = {TRAIN_SPLIT: train_commit, HELD_OUT_SPLIT: held_out_commit}
        rows = [_task_row(repo, plan, index, parents, seed) for index in range(len(plan.tasks))]
        git(repo, "checkout", "-q", "main")
        bundle(repo, out / REPOS_SUBDIR / "constants.bundle")
    (out / "tasks.jsonl").write_text("".join(json.dumps(row, sort_keys=True) + "\n" for row in rows))


FAMILIES = {"constants": _build_constants}


# ---------------------------------------------------------------- entry points


class FamilySource(BaseModel):
    """A parsed `family:<name>[:<seed>[:<train>+<held_out>]]` source: which family, which draw of it, how big."""

    model_config = ConfigDict(frozen=True)

    name: str
    seed: int = 0
    train: int = DEFAULT_TRAIN
    held_out: int = DEFAULT_HELD_OUT


def parse_family_source(source: str) -> FamilySource:
    """`family:<name>[:<seed>[:<train>+<held_out>]]`: the seed defaults to 0 and the sizes to 64 training and 32
    held-out tasks (`family:constants:0:160+96` is seed 0 with 160 and 96)."""
    example = "family:constants, family:constants:1 or family:constants:1:160+96"
    name, _, rest = source.removeprefix("family:").partition(":")
    if name not in FAMILIES:
        raise TaskSetError(f"unknown task family {name!r} in {source!r}; the known families are "
                           f"{', '.join(f'family:{known}' for known in FAMILIES)} (with an optional seed and sizes: "
                           f"{example})")
    seed, _, sizes = rest.partition(":")
    if seed and not seed.lstrip("-").isdigit():
        raise TaskSetError(f"task family source {source!r}: the seed after the name must be an integer ({example})")
    train, plus, held_out = sizes.partition("+")
    if sizes and not (plus and train.isdigit() and held_out.isdigit()):
        raise TaskSetError(f"task family source {source!r}: the sizes after the seed are <train>+<held_out>, two "
                           f"whole numbers ({example})")
    if not sizes:
        return FamilySource(name=name, seed=int(seed or 0))
    return FamilySource(name=name, seed=int(seed or 0), train=int(train), held_out=int(held_out))


def family_dir(name: str, seed: int = 0, train: int = DEFAULT_TRAIN, held_out: int = DEFAULT_HELD_OUT,
               root: Path | None = None) -> Path:
    """The directory holding the family's tasks.jsonl and bundle, built on first use; `root` defaults to the
    machine cache, where it is keyed by (name, seed, sizes, this generator's source), so a changed generator
    never serves stale tasks."""
    if name not in FAMILIES:
        parse_family_source(f"family:{name}")  # raises, naming the known families
    if train < 1 or held_out < 1:
        raise TaskSetError(f"task family {name}: train ({train}) and held_out ({held_out}) must be at least 1")
    source = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]
    parent = root or cache_dir("tasksets", "family")
    out = parent / f"{name}-s{seed}-t{train}-h{held_out}-{source}"
    if (out / "tasks.jsonl").is_file():
        return out
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=parent))
    try:
        FAMILIES[name](staging, seed, train, held_out)
        try:
            os.rename(staging, out)  # atomic: a concurrent builder's equal copy may have won
        except OSError:
            if not (out / "tasks.jsonl").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def family_tasks(name: str, seed: int, train: int = DEFAULT_TRAIN, held_out: int = DEFAULT_HELD_OUT,
                 root: Path | None = None) -> list[Task]:
    """Every task of the family (both splits; `Task.split` is "train" or "eval"), its bundle paths absolute. The
    rows are the generator's own, so they are read as they are (`load_tasks("family:...")` validates them too)."""
    out = family_dir(name, seed, train, held_out, root)
    tasks = []
    for line in (out / "tasks.jsonl").read_text().splitlines():
        task = Task.model_validate_json(line)
        environment = task.environment.model_copy(update={"bundle": str(out / task.environment.bundle)})
        tasks.append(task.model_copy(update={"environment": environment}))
    return tasks
