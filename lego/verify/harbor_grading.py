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
  is even reported, and nothing inside can kill it (signals it does not handle are ignored). Only then does the
  keeper read the reward files, in the holder.

Which reward file counts: only the one(s) test.sh itself writes (RewardProfile). A control run of test.sh without
any patch, with the keeper recording who opens each reward file for writing (lego.sandbox.harbor_seal, observe
mode), tells which files test.sh writes and whether it writes them from its own process; it is cached by the
task's content. When that run writes none (a test.sh that writes only on success), the names tests/ mentions
decide. Harbor reads reward.json before reward.txt, so a graded program writing reward.json beside
test.sh's reward.txt would decide the verdict; a write to a file test.sh does not write is kept as evidence only.

Writes after test.sh's check: when test.sh writes its reward from its own process (`echo 1 > .../reward.txt`,
the usual form), the file is sealed (lego.sandbox.harbor_seal): each write goes through only when everything but
test.sh is dead, so a process the tests left behind cannot replace test.sh's verdict however it times itself.
When test.sh writes it from a process it starts (which cannot be told from the graded code's), or keeps processes
of its own running across a write before its last (which the seal would kill), the file is read as before (the
last write before test.sh's exit), and the task's trust boundary says so.

Outcomes: reward >= 1 resolved, below it unresolved (the value is kept as evidence); a missing or malformed
reward, an untrusted sealed write, or test.sh running past the verifier timeout, is infra_error with the reason.
As in grader.py, such a failure with a non-empty patch is attributed by a control run without the patch: when
that run yields a reward, the patch caused the failure (unresolved), or hanging or breaking test.sh would be a way
out of the loss.

The trust boundary that remains (trust_boundary(), in `lego tasks validate`, the evidence and the run summary):
test.sh runs the graded code as its own user, so the graded code can make test.sh's own check pass (an exit hook
forcing the test command's exit status to 0), and where the file is not sealed, code left running by the tests
can write it until test.sh exits. Lego's SWE-bench-format runner (lego/verify/runner/) closes the first for
pytest; a Harbor test.sh is opaque to it.

One difference from Harbor, which execs test.sh beside the environment's main process: as an init, a test.sh that
signals itself (`kill $$`) without a handler for that signal goes on running instead of ending.
"""

from __future__ import annotations

import base64
import json
import math
import shlex
import shutil
import stat
import tempfile
import threading
from pathlib import Path
from typing import Any

import docker
from docker.errors import DockerException
from pydantic import BaseModel, Field

from lego.cache import cache_dir, content_hash
from lego.config import VerifyConfig
from lego.errors import LegoError, tail
from lego.records import Outcome, OutcomeKind
from lego.sandbox.docker_sandbox import KEEPER_USER, DockerSandbox, DockerSandboxFactory, LastCommand
from lego.sandbox.harbor_image import harbor_sandbox_task
from lego.sandbox.harbor_seal import (
    MANIFEST,
    SEAL_STORE,
    RewardSeal,
    SealMode,
    SealRound,
    SealUnavailable,
    SessionFile,
    parse_manifest,
    resolve_sealed,
)
from lego.tasksets.task import Task, harbor_recipe, is_harbor_task
from lego.verify.cheat import network_attempts, screen_diff
from lego.verify.grading import InfraFailure, apply_agent_patch, graded_outcome

TESTS_MOUNT = "/tests"
LOGS_MOUNT = "/logs"
CHANNEL_MOUNT = "/lego-reward"  # where the reward holder mounts the volume the grading sandbox has at /logs
REWARD_NAMES = ("reward.json", "reward.txt")  # Harbor reads reward.json first
MAX_REWARD_BYTES = 1 << 20
CHANNEL_MARKER = "LEGO-HARBOR-CHANNEL:"
PROFILE_VERSION = "1"  # bump when what a control run records, or how a profile is drawn from it, changes

# Read by the keeper once test.sh and everything it started are gone: each reward file's content (capped), and
# whether anything wrote it (the keeper made them empty and dated them 1970; a write or truncation redates them);
# the same for the inodes the seal kept (<store>/<name>.<round>), and the seal's manifest.
READ_REWARDS = r"""
import base64, json, os, sys
channel, names, limit, marker = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), sys.argv[4]
store, manifest = sys.argv[5], sys.argv[6]
def state(path):
    info = os.lstat(path)
    with open(path, "rb") as handle:
        data = handle.read(limit)
    return {"written": info.st_mtime_ns != 0, "mtime_ns": info.st_mtime_ns, "size": info.st_size,
            "regular": os.path.isfile(path), "data": base64.b64encode(data).decode()}
found = {"live": {name: state(os.path.join(channel, "verifier", name)) for name in names}, "sessions": {},
         "manifest": ""}
kept = os.path.join(channel, store)
for entry in sorted(os.listdir(kept)) if os.path.isdir(kept) else []:
    name, _, number = entry.rpartition(".")
    if name in names and number.isdigit():
        found["sessions"][entry] = dict(state(os.path.join(kept, entry)), name=name, round=int(number))
    elif entry == manifest:
        with open(os.path.join(kept, entry), "rb") as handle:
            found["manifest"] = handle.read(limit).decode("utf-8", "replace")
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


class RewardProfile(BaseModel):
    """How a task's test.sh writes its reward, from a control run (no patch; the keeper records who opens each
    reward file for writing): which files Lego reads, and whether they can be sealed."""

    files: list[str]  # the reward files test.sh writes, in Harbor's order: the only ones read
    sealed: bool  # test.sh writes them from its own process, so each write can be sealed (lego.sandbox.harbor_seal)
    named: list[str] = Field(default_factory=list)  # reward file names that tests/ mentions
    writers: list[dict] = Field(default_factory=list)  # who opened a reward file for writing in the control run
    reason: str = ""  # why not sealed, in words

    def mode(self) -> SealMode | None:
        return SealMode.seal if self.sealed else None


class HarborRun(BaseModel):
    """One run of test.sh and what came through the reward channel."""

    exit_code: int | None
    timed_out: bool
    seconds: float
    log: str = ""
    written: list[RewardFile] = Field(default_factory=list)  # the reward files Lego reads that test.sh wrote
    ignored: list[str] = Field(default_factory=list)  # reward files written that test.sh does not write
    read: bool = True  # False: the keeper could not read the reward files back intact
    channel: str = "open"  # sealed | observed | open (lego.sandbox.harbor_seal)
    seal_unavailable: str | None = None  # why a sealed task's run went unsealed
    untrusted: str | None = None  # why the last write of a sealed reward file cannot be trusted
    rounds: list[SealRound] = Field(default_factory=list)
    kills: int = 0  # kills Lego made for the seal


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
    """The reward as Harbor reads it, from the files Lego reads: reward.json when written, else reward.txt.
    Raises HarborFailure (reward_missing, reward_malformed, reward_channel_broken, reward_unsealed)."""
    if not run.read:
        raise HarborFailure("reward_channel_broken", "the reward files could not be read back after test.sh",
                            run.log, run.exit_code)
    if run.untrusted:
        raise HarborFailure("reward_unsealed", f"the sealed reward cannot be trusted: {run.untrusted}", run.log,
                            run.exit_code)
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


def named_rewards(tests_dir: Path) -> list[str]:
    """The reward file names the task's tests/ mentions, in Harbor's order (a hint: a script may build a name)."""
    text = b"".join(path.read_bytes() for path in sorted(tests_dir.rglob("*")) if path.is_file())
    return [name for name in REWARD_NAMES if name.encode() in text]


def profile_from_run(run: HarborRun, named: list[str]) -> RewardProfile:
    """Which files test.sh wrote in an observed control run, and whether the seal can guard them: test.sh's own
    process (pid 1) opened them, every time, and kept nothing of its own running across a write before its last
    (the seal kills everything but test.sh at each write)."""
    writers = [{**breaker, "file": entry.name} for entry in run.rounds for breaker in entry.breakers]
    observed = [file.name for file in run.written]
    files = [name for name in REWARD_NAMES if name in (observed or named or REWARD_NAMES)]
    others = [writer for writer in writers if writer.get("pid") != 1]
    unseen = [name for name in observed if not any(w["file"] == name and w.get("pid") == 1 for w in writers)]
    last = {entry.name: entry.round for entry in run.rounds}
    early = [entry for entry in run.rounds if entry.name in observed and entry.alive and entry.round < last[entry.name]]
    if run.channel != "observed":
        reason = f"the control run could not observe the reward files ({run.seal_unavailable})"
    elif not observed:
        reason = "test.sh wrote no reward without a patch, so who writes it could not be seen"
    elif others:
        reason = (f"test.sh writes {others[0]['file']} from a process it starts ({tail(others[0].get('cmd', '?'), 120)}"
                  "), which cannot be told from the graded code's")
    elif unseen:
        reason = f"who writes {unseen[0]} could not be seen in the control run"
    elif early:
        command = tail(str((early[0].alive_sample or [{}])[0].get("cmd", "?")), 120)
        reason = (f"test.sh keeps processes of its own running ({command}) across a write of {early[0].name} before "
                  "its last, and the seal would kill them there")
    else:
        reason = ""
    return RewardProfile(files=files, sealed=not reason, named=named, writers=writers[:20], reason=reason)


def trust_boundary(profile: RewardProfile) -> str:
    """The task's remaining trust boundary, in one line (`lego tasks validate`, evidence, the run summary)."""
    files = " and ".join(profile.files)
    head = ("opaque test.sh: the graded code runs as test.sh's user and can make test.sh's own check pass (e.g. an "
            f"exit hook forcing exit 0); Lego reads only {files}")
    if profile.sealed:
        return head + (", sealed: a write goes through only from test.sh's own process with nothing else alive, so "
                       "nothing the tests left running can replace test.sh's verdict")
    return head + f", not sealed ({profile.reason}): code the tests leave running can write it until test.sh exits"


def _profile_key(task: Task, recipe: dict[str, Any]) -> str:
    tests = Path(recipe["tests_dir"])
    files = [part for path in sorted(tests.rglob("*")) if path.is_file()
             for part in (str(path.relative_to(tests)), path.read_bytes())]
    return content_hash(PROFILE_VERSION, task.environment.model_dump_json(), task.base_commit,
                        json.dumps((recipe.get("config") or {}).get("verifier") or {}, sort_keys=True), *files)


def cached_profile(task: Task) -> RewardProfile | None:
    """The task's reward profile if a control run drew it on this machine already; never runs one."""
    recipe = harbor_recipe(task)
    if recipe is None or not (Path(recipe["tests_dir"]) / "test.sh").is_file():
        return None
    path = cache_dir("harbor-reward-profile") / f"{_profile_key(task, recipe)}.json"
    try:
        return RewardProfile.model_validate_json(path.read_text())
    except (OSError, ValueError):
        return None


def harbor_trust_note(tasks: list[Task]) -> str | None:
    """One line for a run summary that graded Harbor tasks: how many are sealed, and the boundary that remains."""
    harbor = list({task.instance_id: task for task in tasks if is_harbor_task(task)}.values())
    if not harbor:
        return None
    profiles = [cached_profile(task) for task in harbor]
    sealed = sum(1 for profile in profiles if profile is not None and profile.sealed)
    unknown = sum(1 for profile in profiles if profile is None)
    return (f"harbor: {len(harbor)} task(s) graded by their own opaque tests/test.sh: the graded code runs as "
            "test.sh's user and can make its check pass (e.g. an exit hook forcing exit 0); Lego reads only the "
            f"reward file test.sh writes, sealed after test.sh's write for {sealed}, not sealed for "
            f"{len(harbor) - sealed - unknown}" + (f", not profiled on this machine for {unknown}" if unknown else "")
            + " (why, per task: lego tasks validate)")


_PROFILE_LOCKS: dict[str, threading.Lock] = {}
_PROFILE_LOCKS_GUARD = threading.Lock()


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
    """Grades Harbor tasks: their tests/test.sh in a fresh sandbox, the reward read through the sealed channel."""

    def __init__(self, client: docker.DockerClient, factory: DockerSandboxFactory, config: VerifyConfig):
        self.client = client
        self.factory = factory
        self.config = config

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
        return float(recipe.get("verifier_timeout_s") or self.config.timeout_s)

    # ------------------------------------------------------------------------------------------ reward profile

    def profile(self, task: Task) -> RewardProfile:
        """Which reward files test.sh writes and whether they can be sealed: from a control run (no patch, the
        keeper observing), once per task content on this machine. Raises InfraFailure when that run cannot be
        made (the grading of this task cannot be either)."""
        recipe = self.check(task)
        key = _profile_key(task, recipe)
        path = cache_dir("harbor-reward-profile") / f"{key}.json"
        with _PROFILE_LOCKS_GUARD:
            lock = _PROFILE_LOCKS.setdefault(key, threading.Lock())
        with lock:
            try:
                return RewardProfile.model_validate_json(path.read_text())
            except (OSError, ValueError):
                pass
            named = named_rewards(Path(recipe["tests_dir"]))
            try:
                served = harbor_sandbox_task(self.client, task)
                with self._open(served, "verify-profile") as (sandbox, holder):
                    run = self._run_tests(sandbox, holder, task, list(REWARD_NAMES), SealMode.observe)
            except (LegoError, DockerException, OSError) as exc:
                raise InfraFailure("reward_profile_failed", f"the control run that tells which reward file "
                                   f"test.sh writes failed: {type(exc).__name__}: {exc}") from exc
            profile = profile_from_run(run, named)
            partial = path.with_suffix(".json.partial")
            partial.write_text(profile.model_dump_json(indent=2))
            partial.replace(path)
            return profile

    # ------------------------------------------------------------------------------------------ grading

    def grade_once(self, task: Task, diff: str, actions: list[str], rollout_id: str) -> Outcome:
        self.check(task)
        profile = self.profile(task)
        screening = screen_diff(diff, task)
        rules = dict(screening.rules)
        evidence: dict[str, Any] = {"dropped_files": [part.path for part in screening.dropped],
                                    "network_attempts": network_attempts(actions), "grading": "harbor",
                                    "trust_boundary": trust_boundary(profile)}
        served = harbor_sandbox_task(self.client, task)
        with self._open(served, "verify") as (sandbox, holder):
            refused = apply_agent_patch(sandbox, task, screening, actions, rules, evidence, rollout_id)
            if refused is not None:
                return refused
            run = self._run_tests(sandbox, holder, task, profile.files, profile.mode())
        evidence.update(self._run_evidence(run, profile))
        try:
            reward = self._reward(run)
        except HarborFailure as failure:
            if not screening.kept:
                raise InfraFailure(failure.check, str(failure), failure.log, failure.exit_code) from failure
            healthy, control = self._control_run(task, profile)
            if not healthy:
                raise InfraFailure(failure.check, f"{failure} (and also without the agent's patch: {control})",
                                   failure.log, failure.exit_code) from failure
            evidence.update(check=f"{failure.check}_caused_by_patch", error=str(failure))
            return graded_outcome(rollout_id, task, OutcomeKind.unresolved, rules, evidence, failure.log,
                                          failure.exit_code)
        evidence.update(check="harbor_reward", reward=reward.value, rewards=reward.rewards,
                        reward_source=reward.source)
        kind = OutcomeKind.resolved if reward.value >= 1.0 else OutcomeKind.unresolved
        return graded_outcome(rollout_id, task, kind, rules, evidence, run.log, run.exit_code)

    def _reward(self, run: HarborRun) -> HarborReward:
        if run.timed_out:
            raise HarborFailure("verifier_timeout", f"test.sh ran past the verifier timeout ({run.seconds:.0f}s)",
                                run.log, run.exit_code)
        return reward_of(run)

    def _control_run(self, task: Task, profile: RewardProfile) -> tuple[bool, str]:
        """test.sh without the agent's patch: does this task's grading yield a reward at all?"""
        try:
            served = harbor_sandbox_task(self.client, task)
            with self._open(served, "verify-control") as (sandbox, holder):
                run = self._run_tests(sandbox, holder, task, profile.files, profile.mode())
            self._reward(run)
        except (InfraFailure, LegoError, DockerException, OSError) as exc:
            return False, f"{type(exc).__name__}: {exc}"
        return True, "healthy"

    @staticmethod
    def _run_evidence(run: HarborRun, profile: RewardProfile) -> dict[str, Any]:
        openers = [dict(breaker, file=entry.name) for entry in run.rounds for breaker in entry.breakers
                   if breaker.get("pid") != 1]
        channel: dict[str, Any] = {"files": profile.files, "channel": run.channel, "rounds": len(run.rounds),
                                   "kills": run.kills, "other_openers": openers[:5]}
        if run.seal_unavailable:
            channel["seal_unavailable"] = run.seal_unavailable
        if run.untrusted:
            channel["untrusted"] = run.untrusted
        return {"test_sh": {"exit_code": run.exit_code, "timed_out": run.timed_out, "seconds": round(run.seconds, 3)},
                "reward_files_written": [file.name for file in run.written],
                "reward_files_ignored": run.ignored, "reward_channel": channel}

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
            served = harbor_sandbox_task(self.client, task)
            with self.factory.open_task(served, purpose="solution", mounts={str(solution): "/solution"},
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

    def _run_tests(self, sandbox: DockerSandbox, holder: DockerSandbox, task: Task, files: list[str],
                   mode: SealMode | None) -> HarborRun:
        """test.sh, then what it left: `files` are the reward files read; `mode` guards them (None: open)."""
        seal, unavailable = None, None
        if mode is not None:
            seal = RewardSeal(sandbox, files, mode, LOGS_MOUNT)
            try:
                seal.start()
            except SealUnavailable as exc:  # the channel of before, and the evidence says so
                seal, unavailable = None, str(exc)
        result = sandbox.run_last_command(self.timeout_s(task))
        # test.sh has exited and, with it, everything in its sandbox (the keeper too): the files are what it left.
        if seal is not None:
            seal.finish()
        read = holder.exec(f"python3 -c {shlex.quote(READ_REWARDS)} {CHANNEL_MOUNT} {','.join(REWARD_NAMES)} "
                           f"{MAX_REWARD_BYTES} {CHANNEL_MARKER} {SEAL_STORE} {MANIFEST}", timeout=60, workdir="/",
                           user=KEEPER_USER)
        line = next((line for line in reversed(read.output.splitlines()) if line.startswith(CHANNEL_MARKER)), None)
        found = json.loads(line[len(CHANNEL_MARKER):]) if line is not None else {}
        live = found.get("live", {})
        intact = line is not None and all(entry["regular"] for entry in live.values())
        sessions = [SessionFile(name=entry["name"], round=entry["round"], written=entry["written"],
                                mtime_ns=entry["mtime_ns"], size=entry["size"], data=base64.b64decode(entry["data"]))
                    for entry in found.get("sessions", {}).values()]
        sessions += [SessionFile(name=name, round=0, written=entry["written"], mtime_ns=entry["mtime_ns"],
                                 size=entry["size"], data=base64.b64decode(entry["data"]))
                     for name, entry in live.items()]
        rounds = parse_manifest(found.get("manifest", "")) if seal is not None else []
        guarded = set(files) if seal is not None else set()
        written, ignored, untrusted = [], [], None
        for name in REWARD_NAMES:
            if name in guarded:
                resolved = resolve_sealed(name, sessions, rounds)
                last = resolved.written
                if mode == SealMode.seal:
                    untrusted = untrusted or resolved.untrusted
            else:
                last = next((s for s in sessions if s.name == name and s.round == 0 and s.written), None)
            if last is None:
                continue
            if name in files:
                written.append(RewardFile(name=name, size=last.size, data=last.data))
            else:
                ignored.append(name)
        channel = {None: "open", SealMode.seal: "sealed", SealMode.observe: "observed"}[mode if seal else None]
        return HarborRun(exit_code=result.exit_code, timed_out=result.timed_out, seconds=result.duration_s,
                         log=tail(result.output, 200_000), written=written, ignored=ignored, read=intact,
                         channel=channel, seal_unavailable=unavailable, untrusted=untrusted, rounds=rounds,
                         kills=seal.kills if seal is not None else 0)


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
        factory = self.grading.factory
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
            # The seal's store (lego.sandbox.harbor_seal) is the keeper's alone: the inodes it kept, its manifest.
            setup = (f"set -e; umask 022; mkdir -m 1777 {CHANNEL_MOUNT}/verifier; "
                     f"mkdir -m 700 {CHANNEL_MOUNT}/{SEAL_STORE}; "
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
                self.grading.factory.remove_volume(self.volume)
        finally:
            if self.staging is not None:
                shutil.rmtree(self.staging, ignore_errors=True)
