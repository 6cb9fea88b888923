"""One rollout (sandbox + proxy session + harness -> Trajectory), and the rollout stage.

A rollout attempt: the task image (built once, cached) -> a proxy session (its id is the only key to its data) with
a unix socket of its own -> a sandbox with that socket's directory mounted read-only and a relay on the container's
loopback (a sandbox can reach its own session and no other) -> the harness,
under its wall-clock limit and a turn guard -> the final diff -> everything closed, always (also on exceptions
and cancellation). Infrastructure failures (daemon, image, container, relay, an engine whose socket vanished) are
retried with a fresh sandbox and session up to rollout.infra_retries times; when they persist the rollout ends
`env_setup_failed` (or `harness_failed`), never as a model failure.

A harness crash is attributed with controls (`attribute_crash`): after at least one model reply, with every call
served without an engine error, a healthy engine (a one-token generate after the crash) and the relay up, the
model's own output provoked it: `harness_crash`, the policy's failure (reward 0). Otherwise it is infra: retried,
then `harness_failed`. The final diff is capped (verify.max_patch_bytes): over it the rollout ends
`patch_too_large` without the diff being transferred; a diff the agent's tree made impossible to take (the same
procedure works on the pristine snapshot) ends `diff_broken`. Both are the policy's failures, never infra.

The turn guard wraps the session's engine: the call after max_turns (plus the harness's side calls) is not
served; the harness is killed and the rollout ends `max_turns`. Harnesses with their own limit (mini's step_limit,
Claude Code's --max-turns, OpenCode's steps) normally stop before it.

The stage runs tasks x samples_per_task (a GRPO group per task) with at most rollout.concurrency at once and
persists each trajectory as soon as it ends (lego.data's atomic writer); rollout ids are deterministic, so a rerun
after a crash skips what was persisted and runs only the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob as globlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import pyarrow.parquet as pq
import urllib3.exceptions
from docker.errors import DockerException

from lego.cache import content_hash
from lego.config import LegoConfig
from lego.engine.base import EngineWrapper, GenerateResult, SamplingParams
from lego.errors import ImageBuildError, LegoError
from lego.harness.base import (
    MOUNT_POINT,
    HarnessAdapter,
    HarnessContext,
    HarnessLaunch,
    HarnessRunResult,
    default_prompt,
    get_harness,
    resolve_version,
)
from lego.harness.install import ensure_installed
from lego.proxy.server import ProxyServer
from lego.proxy.session import Session
from lego.records import LLMCall, TerminationReason, Trajectory
from lego.sandbox import DiffBrokenByAgent, PatchTooLarge
from lego.sandbox.docker_sandbox import KEEPER_UID, DockerSandbox, DockerSandboxFactory, SandboxError
from lego.sandbox.task_image import ensure_task_image
from lego.tasksets.task import Task

RELAY_PORT = 18080  # the relay's port on the container's own loopback (each container has its own)
PID_FILE = "/tmp/.lego-harness.pid"
LOG_LIMIT = 256 * 1024  # harness output kept in Trajectory.harness_log
ENGINE_PROBE_TIMEOUT_S = 60.0


class TurnLimitReached(LegoError):
    """The harness asked for more turns than rollout allows (harness.max_turns)."""


class HarnessFailed(LegoError):
    """The harness crashed for a reason that is not the policy's (before any model reply, or with an engine or
    proxy error): infrastructure, retried with a fresh sandbox and session."""

    def __init__(self, message: str, attribution: dict):
        super().__init__(message)
        self.attribution = attribution


# Failures of the machinery, retried: the sandbox and its engine (a vanished socket or a stopped daemon reaches
# us as FileNotFoundError/ConnectionError, requests' and urllib3's errors: all OSError or urllib3 HTTPError),
# images, and a harness crash that is not the policy's.
INFRA_ERRORS = (SandboxError, ImageBuildError, DockerException, OSError, urllib3.exceptions.HTTPError, HarnessFailed)


def rollout_id(run_id: str, iteration: int, task_id: str, sample_index: int) -> str:
    """Deterministic: the same run, iteration, task and sample always get the same id (reruns skip it)."""
    digest = content_hash(run_id, str(iteration), task_id, str(sample_index), length=10)
    return f"{task_id}.i{iteration}.s{sample_index}.{digest}"


class TurnGuard(EngineWrapper):
    """Wraps a session's engine: serves `limit` generations, then trips instead of serving the next one."""

    def __init__(self, inner, limit: int) -> None:
        super().__init__(inner)
        self.limit = limit
        self.calls = 0
        self.tripped = asyncio.Event()
        self.released = asyncio.Event()

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerateResult:
        self.calls += 1
        if self.calls > self.limit:
            self.tripped.set()
            # Hold the answer until the harness is gone: it must not see an error and retry in the meantime.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.released.wait(), 30)
            raise TurnLimitReached(f"turn limit of {self.limit} calls reached")
        return await self.inner.generate(prompt_ids, sampling)


@dataclass
class RolloutResources:
    """What rollouts of one worker share: the proxy, the sandbox factory, the base image, the harness install."""

    proxy: ProxyServer
    factory: DockerSandboxFactory
    base_image: str
    docker_host: str
    install_dir: Path
    taskset_root: Path | None = None
    artifacts_dir: Path | None = None  # transcripts go to <artifacts_dir>/<rollout id>/

    @property
    def client(self) -> docker.DockerClient:
        return self.factory.client


@dataclass
class _Run:
    exit_code: int = -1
    output: str = ""
    timed_out: bool = False
    guard_tripped: bool = False
    started_at: float = 0.0
    duration_s: float = 0.0


# ---------------------------------------------------------------------------------------------- running a harness


async def _kill_in_sandbox(sandbox: DockerSandbox) -> None:
    script = (f"pid=$(cat {PID_FILE} 2>/dev/null) || exit 0; pgid=$(ps -o pgid= -p $pid | tr -d ' '); "
              f'[ -n "$pgid" ] && kill -9 -- -$pgid; kill -9 $pid 2>/dev/null; true')
    with contextlib.suppress(SandboxError):
        await asyncio.to_thread(sandbox.exec, script, 15, None, "/")


async def _watch_guard(guard: TurnGuard, kill, run: _Run) -> None:
    await guard.tripped.wait()
    run.guard_tripped = True
    try:
        await kill()
    finally:
        guard.released.set()


async def _run_in_sandbox(sandbox: DockerSandbox, launch: HarnessLaunch, timeout_s: float, workdir: str,
                          guard: TurnGuard) -> _Run:
    run = _Run(started_at=time.time())
    for path, data in launch.files.items():
        await asyncio.to_thread(sandbox.put_file, path, data)
    command = f"echo $$ > {PID_FILE}; {launch.command}"
    watcher = asyncio.create_task(_watch_guard(guard, lambda: _kill_in_sandbox(sandbox), run))
    clock = time.monotonic()
    try:
        result = await asyncio.to_thread(sandbox.exec, command, timeout_s, launch.env, workdir, LOG_LIMIT * 4)
    finally:
        watcher.cancel()
        guard.released.set()
    run.duration_s = time.monotonic() - clock
    run.exit_code, run.output, run.timed_out = result.exit_code, result.output, result.timed_out
    return run


async def _run_beside(launch: HarnessLaunch, timeout_s: float, scratch: Path, guard: TurnGuard) -> _Run:
    run = _Run(started_at=time.time())
    for path, data in launch.files.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(data)
    process = await asyncio.create_subprocess_exec(
        "bash", "-c", launch.command, cwd=scratch, env={**os.environ, **launch.env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL,
        start_new_session=True)

    async def kill() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)

    watcher = asyncio.create_task(_watch_guard(guard, kill, run))
    clock = time.monotonic()
    chunks: list[bytes] = []

    async def drain() -> None:
        assert process.stdout is not None
        size = 0
        while chunk := await process.stdout.read(65536):
            if size < LOG_LIMIT * 4:
                chunks.append(chunk)
                size += len(chunk)

    try:
        await asyncio.wait_for(asyncio.gather(drain(), process.wait()), timeout_s)
    except TimeoutError:
        run.timed_out = True
    finally:
        if process.returncode is None:
            await kill()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(process.wait(), 10)
        watcher.cancel()
        guard.released.set()
    run.duration_s = time.monotonic() - clock
    run.exit_code = process.returncode if process.returncode is not None else -9
    run.output = b"".join(chunks).decode("utf-8", errors="replace")
    return run


async def _collect_transcripts(launch: HarnessLaunch, sandbox: DockerSandbox, beside: bool) -> dict[str, str]:
    found: dict[str, str] = {}
    for pattern in launch.transcripts:
        if beside:
            for path in sorted(globlib.glob(pattern)):
                found[path] = Path(path).read_text(errors="replace")
            continue
        listing = await asyncio.to_thread(sandbox.exec, f"ls -1d {pattern} 2>/dev/null || true", 30, None, "/")
        for path in listing.output.split():
            with contextlib.suppress(FileNotFoundError, SandboxError):
                data = await asyncio.to_thread(sandbox.get_file, path)
                found[path] = data.decode("utf-8", errors="replace")
    return found


def _keep_transcripts(transcripts: dict[str, str], directory: Path | None) -> list[str]:
    if directory is None or not transcripts:
        return []
    directory.mkdir(parents=True, exist_ok=True)
    kept = []
    for index, (path, text) in enumerate(sorted(transcripts.items())):
        target = directory / f"{index:02d}-{Path(path).name}"
        target.write_text(text)
        kept.append(str(target))
    return kept


def _terminate(adapter: HarnessAdapter, session: Session, run: _Run, result: HarnessRunResult) -> TerminationReason:
    if session.overlong:
        return TerminationReason.overlong
    if run.guard_tripped:
        return TerminationReason.max_turns
    if run.timed_out:
        return TerminationReason.timeout
    return adapter.termination(result)


def attribute_crash(calls: Sequence[LLMCall], proxy_errors: Sequence[str] = (), engine_probe_error: str | None = None,
                    relay_error: str | None = None) -> dict:
    """Whose failure a harness crash is, from controls (as timeouts and OOM kills are attributed).

    The policy's (`by: policy`) only when the model was served at least one main-thread reply and nothing else
    can explain the crash: no call failed in the engine, the proxy had no internal error, a tiny generate on the
    engine works after the crash (`engine_probe_error` None) and the sandbox's relay to the proxy still answers
    (`relay_error` None). Then it was the model's own output (malformed tool calls, a reply the harness cannot
    parse) that crashed it, and crashing must not be free. Anything else is infra (`by: infra`), retried."""
    served = [call for call in calls if call.error is None and call.completion_tokens > 0]
    main_served = [call for call in served if call.kind != "subagent"]
    engine_errors = [call.error for call in calls if call.error and call.finish_reason != "overlong"]
    evidence = {"served_replies": len(served), "main_replies": len(main_served), "engine_errors": engine_errors[:5],
                "proxy_errors": list(proxy_errors)[:5], "engine_probe": engine_probe_error or "ok",
                "relay_probe": relay_error or "ok"}
    if engine_errors:
        return {"by": "infra", "check": "harness_crash_with_engine_error", **evidence}
    if proxy_errors:
        return {"by": "infra", "check": "harness_crash_with_proxy_error", **evidence}
    if not main_served:
        return {"by": "infra", "check": "harness_crash_before_any_reply", **evidence}
    if engine_probe_error is not None:
        return {"by": "infra", "check": "harness_crash_engine_unhealthy", **evidence}
    if relay_error is not None:
        return {"by": "infra", "check": "harness_crash_relay_down", **evidence}
    return {"by": "policy", "check": "harness_crash_caused_by_policy", **evidence}


async def _probe_engine(engine, calls: Sequence[LLMCall], segments) -> str | None:
    """None when a one-token generate on the policy engine works; else what went wrong."""
    if not any(call.error is None and call.completion_tokens > 0 for call in calls):
        return None  # nothing to probe for: attribute_crash blames infra already
    prompt = [int(token) for token in segments[0].token_ids[:16]] if segments else []
    prompt = prompt or [int(engine.eos_token_ids[0])]
    try:
        await asyncio.wait_for(engine.generate(prompt, SamplingParams(temperature=1.0, max_tokens=1)),
                               ENGINE_PROBE_TIMEOUT_S)
    except Exception as exc:  # any failure of the probe says the engine is not healthy
        return f"{type(exc).__name__}: {exc}"[:500]
    return None


async def _probe_relay(sandbox: DockerSandbox, session_id: str) -> str | None:
    """None when the proxy still answers for the session through the sandbox's relay; else what it said."""
    status, answer = await asyncio.to_thread(sandbox.relay_status, RELAY_PORT, session_id)
    return None if status == "200" else f"the proxy relay on port {RELAY_PORT} answered {answer[-200:] or 'nothing'!r}"


# ---------------------------------------------------------------------------------------------- one rollout


async def _attempt(task: Task, adapter: HarnessAdapter, resources: RolloutResources, config: LegoConfig,
                   trajectory: Trajectory, scratch: Path) -> None:
    """One attempt; fills `trajectory`. Raises an INFRA_ERRORS exception for a failure of the machinery."""
    spec = adapter.spec
    clock = time.monotonic()
    proxy = resources.proxy
    sandbox: DockerSandbox | None = None
    session: Session | None = None
    try:
        image = await asyncio.to_thread(ensure_task_image, resources.client, task, resources.base_image,
                                        resources.taskset_root)
        mounts = {str(resources.install_dir / "install"): MOUNT_POINT} if spec.runs == "sandbox" else None
        # A sandbox harness reaches its session through a socket of the session's own (only the relay's uid may
        # connect; it serves no other session), mounted read-only; beside harnesses use the loopback listener.
        session = proxy.open_session(label=trajectory.rollout_id, own_socket=spec.runs == "sandbox",
                                     socket_uid=KEEPER_UID)
        session_socket = proxy.session_socket(session.id)
        sandbox = await asyncio.to_thread(
            resources.factory.open, image, task.environment.workdir, purpose="rollout", mounts=mounts,
            proxy_socket_dir=session_socket.parent if session_socket else None,
            labels={"lego.rollout": trajectory.rollout_id})
        relay = ""
        if session_socket is not None:
            relay = await asyncio.to_thread(sandbox.start_proxy_relay, session_socket.name, RELAY_PORT, session.id)
        guard = TurnGuard(session.engine, config.harness.max_turns + spec.side_calls)
        session.engine = guard
        setup_s = time.monotonic() - clock
        base_url = f"{relay}/s/{session.id}" if spec.runs == "sandbox" else session.base_url
        context = HarnessContext(
            task=task, prompt=default_prompt(task), base_url=base_url,
            install_dir=resources.install_dir / "install" if spec.runs == "sandbox" else resources.install_dir,
            runtime_dir=MOUNT_POINT if spec.runs == "sandbox" else str(resources.install_dir),
            workdir=task.environment.workdir, max_turns=config.harness.max_turns, timeout_s=config.harness.timeout_s,
            scratch=scratch, container_id=sandbox.container.id, docker_host=resources.docker_host,
            exec_timeout_s=config.sandbox.exec_timeout_s, extra=dict(config.harness.extra))
        launch = adapter.launch(context)
        if spec.runs == "sandbox":
            run = await _run_in_sandbox(sandbox, launch, config.harness.timeout_s, context.workdir, guard)
        else:
            run = await _run_beside(launch, config.harness.timeout_s, scratch, guard)
        if not sandbox.is_running():
            raise SandboxError(f"the sandbox {sandbox.name} died while {spec.name} ran")
        transcripts = await _collect_transcripts(launch, sandbox, spec.runs == "beside")
        segments, calls = session.trajectory_parts()
        main_calls = sum(1 for call in calls if call.kind != "subagent")
        result = HarnessRunResult(run.exit_code, run.output, transcripts,
                                  metadata={"max_turns": config.harness.max_turns, "main_calls": main_calls})
        termination = _terminate(adapter, session, run, result)
        if termination == TerminationReason.harness_crash:
            probe = await _probe_engine(guard.inner, calls, segments)
            relay_error = await _probe_relay(sandbox, session.id) if spec.runs == "sandbox" and probe is None else None
            attribution = attribute_crash(calls, list(session.internal_errors), probe, relay_error)
            trajectory.metadata["failure_attribution"] = attribution
            if attribution["by"] != "policy":
                raise HarnessFailed(f"{spec.name} exited {run.exit_code} ({attribution['check']}): "
                                    f"{run.output[-500:]}", attribution)
        try:
            trajectory.final_diff = await asyncio.to_thread(sandbox.diff, config.verify.max_patch_bytes)
        except (PatchTooLarge, DiffBrokenByAgent) as exc:
            # The agent's doing, whatever else happened: never a partial patch, never an infra retry.
            trajectory.final_diff = ""
            trajectory.error = str(exc)[-2000:]
            too_large = isinstance(exc, PatchTooLarge)
            trajectory.metadata["failure_attribution"] = {
                "by": "policy", "check": "patch_too_large" if too_large else "diff_broken_by_agent",
                "error": str(exc)[-1000:], **({"max_patch_bytes": exc.cap} if too_large else {})}
            if termination not in (TerminationReason.timeout, TerminationReason.overlong):
                termination = TerminationReason.patch_too_large if too_large else TerminationReason.diff_broken
        trajectory.termination = termination
        trajectory.segments, trajectory.calls = segments, calls
        trajectory.harness_log = run.output[-LOG_LIMIT:]
        actions_of = getattr(adapter, "actions", None)
        kept = _keep_transcripts(transcripts, resources.artifacts_dir / trajectory.rollout_id
                                 if resources.artifacts_dir else None)
        first_call = min((call.started_at for call in calls), default=None)
        trajectory.timings.update({
            "sandbox_setup_s": setup_s,
            "harness_start_s": max(0.0, first_call - run.started_at) if first_call else run.duration_s,
            "harness_s": run.duration_s,
            "model_s": sum(call.latency_s for call in calls),
        })
        trajectory.metadata.update({
            "exit_code": run.exit_code, "turn_guard_tripped": run.guard_tripped, "timed_out": run.timed_out,
            "overlong": session.overlong, "transcripts": kept, "main_calls": main_calls,
            "actions": actions_of(result) if actions_of else [],
        })
    finally:
        if session is not None:
            proxy.close_session(session.id)
        if sandbox is not None:
            await asyncio.shield(asyncio.to_thread(sandbox.close))


async def run_rollout(task: Task, adapter: HarnessAdapter, *, resources: RolloutResources, config: LegoConfig,
                      rollout_id: str, iteration: int = 0, sample_index: int = 0) -> Trajectory:
    """Run `adapter` on `task` once (retrying infrastructure failures) and return its Trajectory."""
    clock = time.monotonic()
    attempts = config.rollout.infra_retries + 1
    errors: list[str] = []
    last: BaseException | None = None
    for attempt in range(1, attempts + 1):
        trajectory = Trajectory(
            rollout_id=rollout_id, task_id=task.instance_id, harness=adapter.spec.name,
            policy_version=int(getattr(resources.proxy.engine, "policy_version", 0)), iteration=iteration,
            sample_index=sample_index,
            metadata={"harness_version": resources.install_dir.name, "protocol": adapter.spec.protocol,
                      # the difficulty filter compares pass rates at the policy's sampling temperature
                      "temperature": config.sampling.temperature})
        scratch = Path(tempfile.mkdtemp(prefix="lego-rollout-"))
        try:
            await _attempt(task, adapter, resources, config, trajectory, scratch)
            trajectory.metadata["attempts"] = attempt
            trajectory.metadata["infra_errors"] = errors
            trajectory.timings["total_s"] = time.monotonic() - clock
            return trajectory
        except INFRA_ERRORS as exc:
            errors.append(f"attempt {attempt}: {type(exc).__name__}: {exc}"[-2000:])
            last = exc
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    # Infra to the end: excluded from the loss and retried later, never a model failure.
    crashed = isinstance(last, HarnessFailed)
    trajectory.termination = TerminationReason.harness_failed if crashed else TerminationReason.env_setup_failed
    trajectory.error = errors[-1] if errors else "infrastructure failure"
    trajectory.segments, trajectory.calls = [], []
    trajectory.final_diff = ""
    trajectory.metadata.update({"attempts": attempts, "infra_errors": errors})
    if crashed:
        trajectory.metadata["failure_attribution"] = last.attribution
    trajectory.timings["total_s"] = time.monotonic() - clock
    return trajectory


# ---------------------------------------------------------------------------------------------- the stage


@dataclass
class StageResult:
    trajectories: list[Trajectory] = field(default_factory=list)  # run (and persisted) by this call
    skipped: list[str] = field(default_factory=list)  # ids already persisted by an earlier run
    rollout_ids: list[str] = field(default_factory=list)  # every id of the stage, in order


def persisted_rollout_ids(data_dir: Path) -> set[str]:
    """Rollout ids already committed in one stage/iteration directory (their rollouts file is the commit)."""
    ids: set[str] = set()
    for path in sorted(data_dir.glob("rollouts-*.parquet")):
        ids.update(pq.read_table(path, columns=["rollout_id"]).column("rollout_id").to_pylist())
    return ids


@contextlib.asynccontextmanager
async def rollout_resources(config: LegoConfig, work, engine, *, harness: str | None = None,
                            docker_client: docker.DockerClient | None = None, docker_host: str | None = None,
                            base_image: str | None = None, taskset_root: Path | None = None, tokenizer=None):
    """A started proxy over `engine`, a sandbox factory and the harness install, for one worker."""
    from lego.engine.tokenizer import load_tokenizer
    from lego.sandbox.daemon import docker_engine
    from lego.sandbox.image import ensure_base_image

    adapter = get_harness(harness or config.harness.name)
    install = await asyncio.to_thread(ensure_installed, adapter, config.harness.version)
    async with contextlib.AsyncExitStack() as stack:
        if docker_client is None:
            engine_info = stack.enter_context(docker_engine(work.docker_root, config.docker.host,
                                                            config.docker.start_private_daemon))
            docker_client, docker_host = engine_info.client, engine_info.base_url
        docker_host = docker_host or os.environ.get("DOCKER_HOST", "")
        if base_image is None:
            base_image = await asyncio.to_thread(ensure_base_image, docker_client, config.docker)
        # No shared unix socket: each sandbox rollout gets a socket of its own session (see _attempt).
        proxy = ProxyServer(engine, tokenizer or load_tokenizer(), config.sampling, unix_socket=False)
        await proxy.start()
        stack.push_async_callback(proxy.stop)
        factory = DockerSandboxFactory(docker_client, config.sandbox)
        yield adapter, RolloutResources(proxy=proxy, factory=factory, base_image=base_image, docker_host=docker_host,
                                        install_dir=install, taskset_root=taskset_root,
                                        artifacts_dir=Path(work.artifacts) / "transcripts")


@dataclass(frozen=True)
class PlannedRollout:
    task: Task
    sample_index: int
    rollout_id: str


async def run_planned_rollouts(planned: Sequence[PlannedRollout], config: LegoConfig, work, engine, *, writer,
                               stage: str = "rollout", iteration: int = 0, harness: str | None = None,
                               taskset_root: Path | None = None, docker_client: docker.DockerClient | None = None,
                               docker_host: str | None = None, base_image: str | None = None,
                               progress: bool = True, already_done: int = 0, log=None) -> list[Trajectory]:
    """Run `planned`, rollout.concurrency at a time over one proxy; each trajectory is persisted (under `stage`)
    as soon as it ends, so a crash or Ctrl-C loses none that finished."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    finished: list[Trajectory] = []
    if not planned:
        return finished
    async with rollout_resources(config, work, engine, harness=harness, docker_client=docker_client,
                                 docker_host=docker_host, base_image=base_image,
                                 taskset_root=taskset_root) as (adapter, resources):
        semaphore = asyncio.Semaphore(config.rollout.concurrency)
        lock = asyncio.Lock()
        bar = Progress(TextColumn(f"{stage} [{adapter.spec.name}] iter {iteration}"), BarColumn(),
                       MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.fields[last]}"),
                       disable=not progress)
        job = bar.add_task(stage, total=len(planned) + already_done, completed=already_done, last="")

        async def one(item: PlannedRollout) -> None:
            async with semaphore:
                trajectory = await run_rollout(item.task, adapter, resources=resources, config=config,
                                               rollout_id=item.rollout_id, iteration=iteration,
                                               sample_index=item.sample_index)
            async with lock:
                await asyncio.to_thread(writer.append_trajectories, [trajectory], stage)
                finished.append(trajectory)
                status = f"{item.task.instance_id}#{item.sample_index}: {trajectory.termination.value}"
                bar.update(job, advance=1, last=status)
                if log is not None:
                    log(f"{stage}: {item.rollout_id} -> {trajectory.termination.value}")

        with bar:
            await asyncio.gather(*(one(item) for item in planned))
    return finished


async def run_rollout_stage(tasks: Sequence[Task], config: LegoConfig, work, engine, run_id: str,
                            iteration: int = 0, *, harness: str | None = None, taskset_root: Path | None = None,
                            docker_client: docker.DockerClient | None = None, docker_host: str | None = None,
                            base_image: str | None = None, progress: bool = True) -> StageResult:
    """tasks x samples_per_task rollouts (a GRPO group per task); a rerun skips those already persisted."""
    from lego.data.writer import DatasetWriter

    writer = DatasetWriter(work, run_id)
    planned = [PlannedRollout(task, sample, rollout_id(run_id, iteration, task.instance_id, sample))
               for task in tasks for sample in range(config.rollout.samples_per_task)]
    done = persisted_rollout_ids(writer.directory("rollout", iteration))
    result = StageResult(rollout_ids=[item.rollout_id for item in planned],
                         skipped=[item.rollout_id for item in planned if item.rollout_id in done])
    pending = [item for item in planned if item.rollout_id not in done]
    result.trajectories = await run_planned_rollouts(
        pending, config, work, engine, writer=writer, iteration=iteration, harness=harness,
        taskset_root=taskset_root, docker_client=docker_client, docker_host=docker_host, base_image=base_image,
        progress=progress, already_done=len(result.skipped))
    return result


# ---------------------------------------------------------------------------------------------- verl


_verl_worker: dict[str, Any] = {}


async def run_rollout_for_verl(task: Task, engine) -> tuple[Trajectory, float | None]:
    """verl agent-loop entry (configs/gpu/agent_loops.yaml): one rollout of the configured harness on `task` with
    verl's server engine, graded by the verifier. Config: $LEGO_CONFIG (a name or path; default `default`)."""
    import uuid

    from lego.config import load_config
    from lego.sandbox.daemon import connect
    from lego.sandbox.image import ensure_base_image
    from lego.verify.grader import Verifier
    from lego.workdir import WorkDir

    if not _verl_worker:
        config = load_config(os.environ.get("LEGO_CONFIG", "default"))
        work = WorkDir.create(config.project.work_dir)
        engine_info = connect(work.docker_root, config.docker.host, config.docker.start_private_daemon)
        base = await asyncio.to_thread(ensure_base_image, engine_info.client, config.docker)
        _verl_worker.update(config=config, work=work, docker=engine_info, base_image=base,
                            verifier=Verifier(engine_info.client, base, config.sandbox, config.verify))
    config, work, info = _verl_worker["config"], _verl_worker["work"], _verl_worker["docker"]
    async with rollout_resources(config, work, engine, docker_client=info.client, docker_host=info.base_url,
                                 base_image=_verl_worker["base_image"]) as (adapter, resources):
        trajectory = await run_rollout(task, adapter, resources=resources, config=config,
                                       rollout_id=f"{task.instance_id}.verl.{uuid.uuid4().hex[:10]}")
    outcome = await asyncio.to_thread(_verl_worker["verifier"].verify, task, trajectory)
    trajectory.metadata["outcome"] = outcome.kind.value
    return trajectory, outcome.reward


__all__ = ["PlannedRollout", "RolloutResources", "StageResult", "TurnGuard", "persisted_rollout_ids", "resolve_version",
           "rollout_id", "rollout_resources", "run_rollout", "run_planned_rollouts", "run_rollout_for_verl", "run_rollout_stage"]
