"""The Verifier: a task's grading (pytest with decoys, or a Harbor task's test.sh), infra failures retried, and
rollouts that ended before a diff was worth grading settled without a sandbox.

The gradings are peers behind one interface (lego/verify/grading.py): lego/verify/pytest_grading.py for
SWE-bench-format tasks and lego/verify/harbor_grading.py for Harbor tasks. An infra failure is retried up to
`verify.infra_retries` times and, when it persists, is `infra_error`: left out of the loss, never a reward 0.
"""

from __future__ import annotations

import docker
from docker.errors import DockerException

from lego.config import SandboxConfig, VerifyConfig
from lego.errors import ImageBuildError, tail
from lego.records import Outcome, OutcomeKind, TerminationReason, Trajectory
from lego.sandbox import SandboxError, SandboxFactory
from lego.sandbox.docker_sandbox import DockerSandboxFactory
from lego.tasksets.task import Task, is_harbor_task
from lego.verify.grading import Grading, InfraFailure, infra_check
from lego.verify.harbor_grading import HarborGrading
from lego.verify.pytest_grading import PytestGrading

# How a rollout that ended this way is graded without running tests (the evidence check is
# `termination:<reason>`; the rollout's own attribution is in trajectory.metadata["failure_attribution"]).
TERMINATION_OUTCOME = {
    TerminationReason.timeout: OutcomeKind.agent_timeout,
    TerminationReason.overlong: OutcomeKind.overlong,
    TerminationReason.env_setup_failed: OutcomeKind.infra_error,
    # A crash the model's replies provoked (engine and proxy healthy) is the policy's: reward 0, or crashing
    # would be free. A crash before any reply or with an engine/proxy error is infra (harness_failed).
    TerminationReason.harness_crash: OutcomeKind.unresolved,
    TerminationReason.harness_failed: OutcomeKind.infra_error,
    # The agent's diff is over verify.max_patch_bytes, or its working tree made taking the diff fail.
    TerminationReason.patch_too_large: OutcomeKind.unresolved,
    TerminationReason.diff_broken: OutcomeKind.unresolved,
}




class Verifier:
    def __init__(self, client: docker.DockerClient, base_image: str, sandbox_config: SandboxConfig,
                 verify_config: VerifyConfig, factory: SandboxFactory | None = None):
        self.client = client
        self.base_image = base_image
        self.config = verify_config
        # Grading reaches sandboxes only through the protocol: another backend plugs in as `factory`.
        self.factory = factory or DockerSandboxFactory(client, sandbox_config, base_image=base_image)
        self.pytest_grading = PytestGrading(self.factory, verify_config)
        self.harbor_grading = HarborGrading(client, self.factory, verify_config)

    def grading_for(self, task: Task) -> Grading:
        """A Harbor task is graded by its tests/test.sh and the reward it writes; any other by its tests."""
        return self.harbor_grading if is_harbor_task(task) else self.pytest_grading

    def verify(self, task: Task, trajectory: Trajectory | None = None, *, diff: str | None = None,
               actions: list[str] | None = None) -> Outcome:
        """Grade a rollout (its final diff), retrying infra failures; never raises for the agent's doing."""
        grading = self.grading_for(task)
        grading.check(task)
        rollout_id = trajectory.rollout_id if trajectory else f"{task.instance_id}:adhoc"
        if diff is None:
            diff = trajectory.final_diff if trajectory else ""
        if actions is None and trajectory is not None:
            actions = list(trajectory.metadata.get("actions", []))
        if trajectory is not None and trajectory.termination in TERMINATION_OUTCOME:
            kind = TERMINATION_OUTCOME[trajectory.termination]
            return Outcome(rollout_id, task.instance_id, kind,
                           evidence={"check": f"termination:{trajectory.termination.value}",
                                     "error": trajectory.error,
                                     "attribution": trajectory.metadata.get("failure_attribution")})
        limit = self.config.max_patch_bytes
        if len(diff.encode("utf-8", errors="replace")) > limit:
            # Never graded in part, never transferred: a patch this large is the agent's doing.
            return Outcome(rollout_id, task.instance_id, OutcomeKind.unresolved,
                           evidence={"check": "patch_too_large", "patch_bytes": len(diff.encode(errors="replace")),
                                     "max_patch_bytes": limit})
        history: list[dict] = []  # every infra failure, kept in the final outcome's evidence
        outcome: Outcome | None = None
        attempts = self.config.infra_retries + 1
        for attempt in range(1, attempts + 1):
            try:
                outcome = grading.grade_once(task, diff, actions or [], rollout_id)
            except InfraFailure as failure:
                outcome = Outcome(rollout_id, task.instance_id, OutcomeKind.infra_error,
                                  evidence={"check": failure.check, "error": str(failure)},
                                  test_log=failure.log, exit_code=failure.exit_code)
            except (SandboxError, ImageBuildError, DockerException, OSError) as exc:
                outcome = Outcome(rollout_id, task.instance_id, OutcomeKind.infra_error,
                                  evidence={"check": infra_check(exc), "error": f"{type(exc).__name__}: {exc}"})
            outcome.attempts = attempt
            if history:
                outcome.evidence["infra_history"] = list(history)
            if outcome.kind != OutcomeKind.infra_error:
                return outcome
            history.append({"attempt": attempt, "check": outcome.evidence["check"],
                            "error": tail(str(outcome.evidence.get("error", "")))})
        assert outcome is not None
        return outcome



def verify_patch(verifier: Verifier, task: Task, patch: str) -> Outcome:
    """Grade a bare patch (gold or empty): used by `lego tasks validate`."""
    return verifier.verify(task, diff=patch, actions=[])
