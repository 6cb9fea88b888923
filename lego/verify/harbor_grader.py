"""Harbor grading: a Harbor task's tests/test.sh, run in a fresh sandbox, its reward read through a guarded channel.

Harbor (harbor.verifier.verifier) grades a trial by copying the task's tests/ to /tests in the environment,
running /tests/test.sh there, and reading /logs/verifier/reward.json (a JSON object of numbers, or one number) or
else /logs/verifier/reward.txt (one number); a missing, empty or unparsable reward file is an error, never a
reward. Lego does the same in its own grading sandbox, apart from the agent's:

- the sandbox is fresh, from the task's clean image; the agent's diff is screened as for every task
  (lego/verify/cheat.py: test files, conftest.py, paths outside the repository dropped and flagged) and applied
  with `git apply`, exactly as lego/verify/grader.py does;
- tests/ is copied in only now (a read-only mount at /tests): the agent's sandbox never had it;
- /logs is a scratch volume in memory whose `verifier` directory the keeper (the sandboxes' second user, which the
  agent's uid cannot signal or impersonate) prepares from a second sandbox, the reward holder, which mounts the
  same volume and in which no graded code ever runs. The directory is sticky and world-writable, so test.sh can
  write its logs there; reward.txt and reward.json in it are empty files the keeper made, writable but not
  readable by others (mode 0622) and dated 1970: the graded code can neither create them before test.sh (the
  patch only reaches the repository, and nothing of it runs before test.sh), nor replace, rename, remove or read
  them (the sticky bit), and a write redates them, so "written" is told from "left empty";
- test.sh is the grading sandbox's last command (lego.sandbox.docker_sandbox.LastCommand): it runs as the init of
  the container's PID namespace, so when it exits the kernel kills every process it left behind before its exit
  is even reported: nothing the graded code started can write a reward after test.sh is done, however it waits
  for that moment. (A kill sent after test.sh's exit, as before, left tens of milliseconds in which a process
  that watched for the exit wrote reward 1 every time.) As an init, test.sh also cannot be killed by what it
  runs: signals from inside the namespace that it does not handle are ignored. Only then does the keeper read
  the reward files, in the holder. (Named pipes would record every write, but successive writes merge in a
  pipe; a file's last write is what Harbor reads.)

Outcomes: reward >= 1 resolved, below it unresolved (the value is kept as evidence); a missing or malformed
reward, or test.sh running past the verifier timeout, is infra_error with the reason. As in grader.py, such a
failure with a non-empty patch is attributed by a control run without the patch: when that run yields a reward,
the patch caused the failure (unresolved), or hanging or breaking test.sh would be a way out of the loss.

The trust boundary that remains, as in Harbor itself: test.sh runs the graded code as its own user, so code that
runs during test.sh can write the reward files while test.sh runs (a write after test.sh's own final write and
before it exits wins), and can make the test command report success (exit 0 from inside the tests). Lego's
SWE-bench-format runner (lego/verify/runner/) closes these for pytest; a Harbor test.sh is opaque to it. The
evidence keeps which reward files were written, so such runs can be found afterwards.

One difference from Harbor, which execs test.sh beside the environment's main process: as an init, a test.sh that
signals itself (`kill $$`) without a handler for that signal goes on running instead of ending.
"""

from __future__ import annotations

import base64
import json
import math
import shutil
import stat
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from docker.errors import DockerException
from pydantic import BaseModel, Field

from lego.errors import LegoError, tail
from lego.records import Outcome, OutcomeKind
from lego.sandbox.docker_sandbox import KEEPER_USER, DockerSandbox, DockerSandboxFactory, LastCommand
from lego.sandbox.harbor_image import harbor_sandbox_task
from lego.tasksets.task import Task, harbor_recipe
from lego.verify.cheat import action_probes, network_attempts, scan_actions, screen_diff
from lego.verify.grader import InfraFailure

if TYPE_CHECKING:
    from lego.verify.grader import Verifier

TESTS_MOUNT = "/tests"
LOGS_MOUNT = "/logs"
CHANNEL_MOUNT = "/lego-reward"  # where the reward holder mounts the volume the grading sandbox has at /logs
REWARD_NAMES = ("reward.json", "reward.txt")  # Harbor reads reward.json first
MAX_REWARD_BYTES = 1 << 20
CHANNEL_MARKER = "LEGO-HARBOR-CHANNEL:"

# Read by the keeper once test.sh and everything it started are gone: each reward file's content (capped), and
# whether anything wrote it (the keeper made them empty and dated them 1970; a write or truncation redates them).
READ_REWARDS = r"""
import base64, json, os, sys
channel, names, limit, marker = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), sys.argv[4]
found = {}
for name in names:
    path = os.path.join(channel, "verifier", name)
    info = os.lstat(path)
    with open(path, "rb") as handle:
        data = handle.read(limit)
    found[name] = {"written": info.st_mtime != 0, "size": info.st_size, "regular": os.path.isfile(path),
                   "data": base64.b64encode(data).decode()}
print(marker + json.dumps(found))
"""

CHANNEL_MB = 64  # the reward volume: test.sh's logs in /logs/verifier count against it


class HarborTaskError(LegoError):
    """A Harbor task's grading recipe cannot be run as it stands (no tests/test.sh where it says)."""


class HarborChannelUnsupported(LegoError):
    """The sandbox backend cannot run test.sh as the init of its sandbox, or read the reward from apart."""


class HarborFailure(InfraFailure):
    """Harbor's verifier gave no reward: test.sh ran past its time, its reward file is missing or malformed, or
    the reward channel broke. Infra unless a control run without the patch blames the patch."""


class RewardFile(BaseModel):
    name: str
    size: int
    data: bytes  # the first MAX_REWARD_BYTES


class HarborRun(BaseModel):
    """One run of test.sh and what came through the reward channel."""

    exit_code: int | None
    timed_out: bool
    seconds: float
    log: str = ""
    written: list[RewardFile] = Field(default_factory=list)  # the reward files test.sh wrote
    read: bool = True  # False: the keeper could not read the reward files back intact


class HarborReward(BaseModel):
    source: str  # reward.json | reward.txt
    rewards: dict[str, float]
    value: float


def parse_reward(name: str, data: bytes) -> dict[str, float]:
    """Harbor's rules (harbor.verifier.verifier): reward.txt holds one finite number; reward.json an object of
    finite numbers, or one number. Raises ValueError saying what is wrong."""
    if not data.strip():
        raise ValueError(f"{name} is empty")
    text = data.decode("utf-8", errors="strict")
    if name == "reward.txt":
        value = float(text)
        if not math.isfinite(value):
            raise ValueError(f"{name} holds a non-finite reward {text.strip()!r}")
        return {"reward": value}
    parsed = json.loads(text)
    rewards = parsed if isinstance(parsed, dict) else {"reward": parsed}
    for key, value in rewards.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"{name}: reward {key!r} is {value!r}, not a finite number")
    if not rewards:
        raise ValueError(f"{name} holds no reward")
    return {str(key): float(value) for key, value in rewards.items()}


def reward_of(run: HarborRun) -> HarborReward:
    """The reward as Harbor reads it: reward.json when written, else reward.txt. Raises HarborFailure
    (reward_missing, reward_malformed, reward_channel_broken)."""
    if not run.read:
        raise HarborFailure("reward_channel_broken", "the reward files could not be read back after test.sh",
                            run.log, run.exit_code)
    for name in REWARD_NAMES:
        last = next((file for file in run.written if file.name == name), None)
        if last is None:
            continue
        if last.size > MAX_REWARD_BYTES:
            raise HarborFailure("reward_malformed", f"{name} is {last.size} bytes, over {MAX_REWARD_BYTES}",
                                run.log, run.exit_code)
        try:
            rewards = parse_reward(name, last.data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise HarborFailure("reward_malformed", f"{name} is malformed: {tail(str(exc), 300)}", run.log,
                                run.exit_code) from exc
        if "reward" in rewards:
            value = rewards["reward"]
        elif len(rewards) == 1:
            value = next(iter(rewards.values()))
        else:
            raise HarborFailure("reward_malformed", f"{name} has several rewards ({', '.join(sorted(rewards))}) "
                                "and none named 'reward': Lego needs one to grade by", run.log, run.exit_code)
        return HarborReward(source=name, rewards=rewards, value=value)
    raise HarborFailure("reward_missing", "test.sh wrote no reward (/logs/verifier/reward.txt or reward.json)",
                        run.log, run.exit_code)


def _stage_dir(source: Path, into: Path) -> Path:
    """A copy the sandbox's users can read (a task set's own directory may be private to its owner)."""
    target = into / source.name
    shutil.copytree(source, target, symlinks=False)
    for path in [target, *target.rglob("*")]:
        mode = path.stat().st_mode
        path.chmod(mode | stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH
                   | ((stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH) if path.is_dir() or mode & stat.S_IXUSR else 0))
    return target


class HarborGrading:
    """Grades Harbor tasks for a Verifier (its sandbox factory, config, patch application and outcome rules)."""

    def __init__(self, verifier: Verifier):
        self.verifier = verifier

    def check(self, task: Task) -> dict[str, Any]:
        recipe = harbor_recipe(task)
        if recipe is None:
            raise HarborTaskError(f"task {task.instance_id} is not a Harbor task (no provenance.harbor.tests_dir)")
        if not (Path(recipe["tests_dir"]) / "test.sh").is_file():
            raise HarborTaskError(
                f"Harbor task {task.instance_id}: {recipe['tests_dir']}/test.sh does not exist, so it cannot be "
                f"graded; restore the task directory ({recipe.get('task_dir')}) or leave the task out")
        return recipe

    def timeout_s(self, task: Task) -> float:
        recipe = self.check(task)
        return float(recipe.get("verifier_timeout_s") or self.verifier.config.timeout_s)

    # ------------------------------------------------------------------------------------------ grading

    def grade_once(self, task: Task, diff: str, actions: list[str], rollout_id: str) -> Outcome:
        self.check(task)
        screening = screen_diff(diff, task)
        rules = dict(screening.rules)
        evidence: dict[str, Any] = {"dropped_files": [part.path for part in screening.dropped],
                                    "network_attempts": network_attempts(actions), "grading": "harbor"}
        served = harbor_sandbox_task(self.verifier.client, task)
        with self._open(served, "verify") as (sandbox, holder):
            base_files = set(sandbox.exec("git ls-files", timeout=60).output.split())
            evidence.update(action_probes(actions, task, base_files))
            for rule, items in scan_actions(actions, task, base_files).items():
                rules.setdefault(rule, []).extend(items)
            if screening.kept:
                applied = self.verifier._apply(sandbox, screening.patch, "/tmp/lego-agent.patch")
                if applied.exit_code != 0:
                    evidence.update(check="agent_patch_does_not_apply", apply_output=tail(applied.output))
                    return self.verifier._outcome(rollout_id, task, OutcomeKind.unresolved, rules, evidence, "",
                                                  None)
            run = self._run_tests(sandbox, holder, task)
        evidence.update(self._run_evidence(run))
        try:
            reward = self._reward(run)
        except HarborFailure as failure:
            if not screening.kept:
                raise InfraFailure(failure.check, str(failure), failure.log, failure.exit_code) from failure
            healthy, control = self._control_run(task)
            if not healthy:
                raise InfraFailure(failure.check, f"{failure} (and also without the agent's patch: {control})",
                                   failure.log, failure.exit_code) from failure
            evidence.update(check=f"{failure.check}_caused_by_patch", error=str(failure))
            return self.verifier._outcome(rollout_id, task, OutcomeKind.unresolved, rules, evidence, failure.log,
                                          failure.exit_code)
        evidence.update(check="harbor_reward", reward=reward.value, rewards=reward.rewards,
                        reward_source=reward.source)
        kind = OutcomeKind.resolved if reward.value >= 1.0 else OutcomeKind.unresolved
        return self.verifier._outcome(rollout_id, task, kind, rules, evidence, run.log, run.exit_code)

    def _reward(self, run: HarborRun) -> HarborReward:
        if run.timed_out:
            raise HarborFailure("verifier_timeout", f"test.sh ran past the verifier timeout ({run.seconds:.0f}s)",
                                run.log, run.exit_code)
        return reward_of(run)

    def _control_run(self, task: Task) -> tuple[bool, str]:
        """test.sh without the agent's patch: does this task's grading yield a reward at all?"""
        try:
            served = harbor_sandbox_task(self.verifier.client, task)
            with self._open(served, "verify-control") as (sandbox, holder):
                run = self._run_tests(sandbox, holder, task)
            self._reward(run)
        except (InfraFailure, LegoError, DockerException, OSError) as exc:
            return False, f"{type(exc).__name__}: {exc}"
        return True, "healthy"

    @staticmethod
    def _run_evidence(run: HarborRun) -> dict[str, Any]:
        return {"test_sh": {"exit_code": run.exit_code, "timed_out": run.timed_out, "seconds": round(run.seconds, 3)},
                "reward_files_written": [file.name for file in run.written]}


    def solution_diff(self, task: Task, timeout_s: float = 600.0) -> str:
        """The effect of the task's solution/solve.sh (what Harbor's oracle agent runs) as a diff: run in a fresh
        agent sandbox with solution/ at /solution, no tests. The gold patch of a Harbor task."""
        recipe = self.check(task)
        if not recipe.get("solution"):
            raise HarborTaskError(f"Harbor task {task.instance_id} has no solution/solve.sh to take a gold patch from")
        staging = Path(tempfile.mkdtemp(prefix="lego-harbor-solution-"))
        try:
            staging.chmod(0o755)
            solution = _stage_dir(Path(recipe["solution"]).parent, staging)
            (solution / "solve.sh").chmod(0o755)
            served = harbor_sandbox_task(self.verifier.client, task)
            with self.verifier.factory.open_task(served, purpose="solution", mounts={str(solution): "/solution"},
                                                 labels={"lego.task": task.instance_id}) as sandbox:
                result = sandbox.exec("/solution/solve.sh 2>&1", timeout=timeout_s)
                if result.exit_code != 0:
                    raise HarborTaskError(f"Harbor task {task.instance_id}: solution/solve.sh exited "
                                          f"{result.exit_code}: {tail(result.output)}")
                return sandbox.diff()
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    # ------------------------------------------------------------------------------------------ the sandbox

    def _open(self, task: Task, purpose: str) -> _Opened:
        return _Opened(self, task, purpose)

    def _run_tests(self, sandbox: DockerSandbox, holder: DockerSandbox, task: Task) -> HarborRun:
        result = sandbox.run_last_command(self.timeout_s(task))
        # test.sh has exited and, with it, everything in its sandbox: the reward files are what it left.
        names = ",".join(REWARD_NAMES)
        read = holder.exec(f"python3 -c {_quote(READ_REWARDS)} {CHANNEL_MOUNT} {names} {MAX_REWARD_BYTES} "
                           f"{CHANNEL_MARKER}", timeout=60, workdir="/", user=KEEPER_USER)
        line = next((line for line in reversed(read.output.splitlines()) if line.startswith(CHANNEL_MARKER)), None)
        found = json.loads(line[len(CHANNEL_MARKER):]) if line is not None else {}
        intact = line is not None and all(entry["regular"] for entry in found.values())
        written = [RewardFile(name=name, size=entry["size"], data=base64.b64decode(entry["data"]))
                   for name, entry in found.items() if entry["written"]]
        return HarborRun(exit_code=result.exit_code, timed_out=result.timed_out, seconds=result.duration_s,
                         log=tail(result.output, 200_000), written=written, read=intact)


class _Opened:
    """A grading sandbox for a Harbor task, ending with test.sh, with /tests mounted and /logs a scratch volume that
    the reward holder (a second sandbox, nothing graded in it) mounts too; yields (sandbox, holder)."""

    def __init__(self, grading: HarborGrading, task: Task, purpose: str):
        self.grading, self.task, self.purpose = grading, task, purpose
        self.staging: Path | None = None
        self.volume: str | None = None
        self.opened: list[DockerSandbox] = []

    def __enter__(self) -> tuple[DockerSandbox, DockerSandbox]:
        recipe = self.grading.check(self.task)
        factory = self.grading.verifier.factory
        if not isinstance(factory, DockerSandboxFactory):
            raise HarborChannelUnsupported(
                f"the sandbox backend {type(factory).__name__} cannot run test.sh as the init of its sandbox with "
                "the reward read from a second one, which Harbor grading needs so that nothing the graded code "
                "starts can write a reward after test.sh; grade Harbor tasks with the Docker sandbox backend")
        try:
            self.staging = Path(tempfile.mkdtemp(prefix="lego-harbor-"))
            self.staging.chmod(0o755)
            tests = _stage_dir(Path(recipe["tests_dir"]), self.staging / "tests-copy")
            (tests / "test.sh").chmod(0o755)  # Harbor makes it executable too
            (self.staging / "tests-copy").chmod(0o755)
            self.volume = factory.scratch_volume(f"{self.purpose}-reward", CHANNEL_MB)
            labels = {"lego.task": self.task.instance_id}
            holder = factory.open_task(self.task, purpose=f"{self.purpose}-reward", labels=labels,
                                       volumes={self.volume: CHANNEL_MOUNT}, repository=False)
            self.opened.append(holder)
            setup = (f"set -e; umask 022; mkdir -m 1777 {CHANNEL_MOUNT}/verifier; "
                     + "; ".join(f"f={CHANNEL_MOUNT}/verifier/{name}; : > $f; chmod 622 $f; touch -d @0 $f"
                                 for name in REWARD_NAMES))
            prepared = holder.exec(setup, timeout=30, workdir="/", user=KEEPER_USER)
            if prepared.exit_code != 0:
                raise HarborFailure("reward_channel_broken", f"preparing the reward files in {holder.name} failed: "
                                    f"{tail(prepared.output)}")
            env = {str(key): str(value) for key, value in ((recipe.get("config") or {}).get("verifier") or {})
                   .get("env", {}).items()}
            # As Harbor does: the script itself (its shebang), from the environment's working directory.
            last = LastCommand(argv=(f"{TESTS_MOUNT}/test.sh",), workdir=self.task.environment.workdir, env=env)
            sandbox = factory.open_task(self.task, purpose=self.purpose, mounts={str(tests): TESTS_MOUNT},
                                        volumes={self.volume: LOGS_MOUNT}, last_command=last, labels=labels)
            self.opened.append(sandbox)
        except BaseException:
            self.__exit__()
            raise
        return sandbox, holder

    def __exit__(self, *exc: object) -> None:
        try:
            for sandbox in reversed(self.opened):
                sandbox.close()
            if self.volume is not None:
                self.grading.verifier.factory.remove_volume(self.volume)
        finally:
            if self.staging is not None:
                shutil.rmtree(self.staging, ignore_errors=True)


def _quote(script: str) -> str:
    import shlex

    return shlex.quote(script)
