"""One rollout of one task: attempts with a fresh sandbox and session until one is not an infra failure (or the
retries run out), returned as a Trajectory."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path

from lego.config import LegoConfig
from lego.errors import tail
from lego.harness.base import (
    MOUNT_POINT,
    HarnessAdapter,
    HarnessContext,
    HarnessRunResult,
    default_prompt,
)
from lego.proxy.session import Session
from lego.records import TerminationReason, Trajectory
from lego.rollout.failures import INFRA_ERRORS, HarnessFailed, attribute_crash, probe_engine, probe_relay
from lego.rollout.guard import TurnGuard
from lego.rollout.harness_process import (
    LOG_LIMIT,
    HarnessRun,
    collect_transcripts,
    keep_transcripts,
    run_beside,
    run_in_sandbox,
)
from lego.rollout.resources import RolloutResources
from lego.sandbox import DiffBrokenByAgent, PatchTooLarge, Sandbox, SandboxError
from lego.tasksets.task import Task

RELAY_PORT = 18080  # the relay's port on the sandbox's own loopback (each sandbox has its own)


def _terminate(adapter: HarnessAdapter, session: Session, run: HarnessRun,
               result: HarnessRunResult) -> TerminationReason:
    if session.overlong:
        return TerminationReason.overlong
    if run.guard_tripped:
        return TerminationReason.max_turns
    if run.timed_out:
        return TerminationReason.timeout
    return adapter.termination(result)


async def _check_running(sandbox: Sandbox, when: str) -> None:
    """An infra failure when the sandbox is gone (killed, out of memory): the attempt is retried."""
    if not await asyncio.to_thread(sandbox.is_running):
        raise SandboxError(f"the sandbox {sandbox.name} died {when}")


async def _take_final_diff(sandbox: Sandbox, config: LegoConfig, trajectory: Trajectory,
                           termination: TerminationReason) -> TerminationReason:
    """The sandbox's diff as `trajectory.final_diff`, and how the run ended once a diff the agent made too large
    or broke is counted."""
    try:
        trajectory.final_diff = await asyncio.to_thread(sandbox.diff, config.verify.max_patch_bytes)
    except (PatchTooLarge, DiffBrokenByAgent) as exc:
        # The agent's doing, whatever else happened: never a partial patch, never an infra retry.
        trajectory.final_diff = ""
        trajectory.error = tail(str(exc))
        too_large = isinstance(exc, PatchTooLarge)
        trajectory.metadata["failure_attribution"] = {
            "by": "policy", "check": "patch_too_large" if too_large else "diff_broken_by_agent",
            "error": tail(str(exc)), **({"max_patch_bytes": exc.cap} if too_large else {})}
        if termination not in (TerminationReason.timeout, TerminationReason.overlong):
            termination = TerminationReason.patch_too_large if too_large else TerminationReason.diff_broken
    return termination


async def _attempt(task: Task, adapter: HarnessAdapter, resources: RolloutResources, config: LegoConfig,
                   trajectory: Trajectory, scratch: Path, seed: int | None) -> None:
    """One attempt; fills `trajectory`. Raises an INFRA_ERRORS exception for a failure of the machinery."""
    spec = adapter.spec
    in_sandbox = spec.runs == "sandbox"
    clock = time.monotonic()
    proxy = resources.proxy
    sandbox: Sandbox | None = None
    session: Session | None = None
    try:
        mounts = {str(resources.install_dir / "install"): MOUNT_POINT} if in_sandbox else None
        # A sandbox harness reaches its session through a socket of the session's own (only the relay's uid may
        # connect; it serves no other session), mounted read-only; beside harnesses use the loopback listener.
        session = proxy.open_session(label=trajectory.rollout_id, own_socket=in_sandbox,
                                     socket_uid=resources.factory.proxy_socket_uid, seed=seed)
        session_socket = proxy.session_socket(session.id)
        sandbox = await asyncio.to_thread(
            resources.factory.open_task, task, purpose="rollout", mounts=mounts,
            proxy_socket_dir=session_socket.parent if session_socket else None,
            labels={"lego.rollout": trajectory.rollout_id})
        relay = ""
        if session_socket is not None:
            relay = await asyncio.to_thread(sandbox.start_proxy_relay, session_socket.name, RELAY_PORT, session.id)
        engine = resources.engine_for(task) if resources.engine_for is not None else session.engine
        guard = TurnGuard(engine, config.harness.max_turns + spec.side_calls)
        session.engine = guard
        setup_s = time.monotonic() - clock
        context = HarnessContext(
            task=task, prompt=default_prompt(task),
            base_url=f"{relay}/s/{session.id}" if in_sandbox else session.base_url,
            install_dir=resources.install_dir / "install" if in_sandbox else resources.install_dir,
            runtime_dir=MOUNT_POINT if in_sandbox else str(resources.install_dir),
            workdir=task.environment.workdir, max_turns=config.harness.max_turns, timeout_s=config.harness.timeout_s,
            scratch=scratch, container_id=sandbox.sandbox_id, docker_host=resources.docker_host,
            exec_timeout_s=config.sandbox.exec_timeout_s, extra=dict(config.harness.extra),
            forkserver=resources.forkserver)
        await _check_running(sandbox, f"before {spec.name} started")  # no harness start spent on a dead one
        launch = adapter.launch(context)
        if in_sandbox:
            run = await run_in_sandbox(sandbox, launch, config.harness.timeout_s, context.workdir, guard)
        else:
            run = await run_beside(launch, config.harness.timeout_s, scratch, guard)
        await _check_running(sandbox, f"while {spec.name} ran")
        transcripts = await collect_transcripts(launch, sandbox, beside=not in_sandbox)
        segments, calls = session.trajectory_parts()
        main_calls = sum(1 for call in calls if call.kind != "subagent")
        result = HarnessRunResult(run.exit_code, run.output, transcripts,
                                  metadata={"max_turns": config.harness.max_turns, "main_calls": main_calls})
        termination = _terminate(adapter, session, run, result)
        if termination == TerminationReason.harness_crash:
            probe = await probe_engine(guard.inner, calls, segments)
            relay_error = (await probe_relay(sandbox, RELAY_PORT, session.id)
                           if in_sandbox and probe is None else None)
            attribution = attribute_crash(calls, list(session.internal_errors), probe, relay_error)
            trajectory.metadata["failure_attribution"] = attribution
            if attribution["by"] != "policy":
                raise HarnessFailed(f"{spec.name} exited {run.exit_code} ({attribution['check']}): "
                                    f"{tail(run.output)}", attribution)
        trajectory.termination = await _take_final_diff(sandbox, config, trajectory, termination)
        trajectory.segments, trajectory.calls = segments, calls
        trajectory.harness_log = run.output[-LOG_LIMIT:]
        actions_of = getattr(adapter, "actions", None)
        kept = keep_transcripts(transcripts, resources.artifacts_dir / trajectory.rollout_id
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
                      rollout_id: str, iteration: int = 0, sample_index: int = 0,
                      seed: int | None = None) -> Trajectory:
    """Run `adapter` on `task` once (retrying infrastructure failures) and return its Trajectory. `seed`: the
    attempt's sampling seed (lego.rollout.requests), the same for each infrastructure retry."""
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
                      "temperature": config.sampling.temperature, "sampling_seed": seed})
        scratch = Path(tempfile.mkdtemp(prefix="lego-rollout-"))
        try:
            await _attempt(task, adapter, resources, config, trajectory, scratch, seed)
            trajectory.metadata["attempts"] = attempt
            trajectory.metadata["infra_errors"] = errors
            trajectory.timings["total_s"] = time.monotonic() - clock
            return trajectory
        except INFRA_ERRORS as exc:
            errors.append(tail(f"attempt {attempt}: {type(exc).__name__}: {exc}"))
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
