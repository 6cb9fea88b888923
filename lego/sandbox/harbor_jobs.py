"""Harbor jobs driven from Lego: `harbor run` in Harbor's venv (a subprocess; Harbor cannot be imported into
Lego's Python 3.11), and its trial results read onto Lego's outcome taxonomy.

Harbor records each trial in <jobs_dir>/<job>/<trial>/result.json (harbor.models.trial.result.TrialResult): the
verifier's rewards, and the exception that ended the trial, by class name. What is whose fault:
- AgentTimeoutError: the agent ran past its time, the policy's doing: `agent_timeout` (as a Lego rollout's timeout);
- every other exception (the environment would not build or start, EnvironmentStartTimeoutError, the agent's setup,
  VerifierTimeoutError, RewardFileNotFoundError, RewardFileEmptyError, VerifierOutputParseError, anything else),
  and a trial with no reward: `infra_error`, never a reward of 0;
- otherwise the reward: >= 1 `resolved`, below `unresolved` (Harbor's reward 1 is a pass, as in
  lego/verify/harbor_grading.py).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from pydantic import BaseModel

from lego.errors import LegoError, tail
from lego.records import OutcomeKind
from lego.sandbox.harbor_env import harbor_process_env

POLICY_FAULTS = {"AgentTimeoutError": OutcomeKind.agent_timeout}


class HarborJobError(LegoError):
    """`harbor run` itself failed (bad arguments, Harbor missing) or left no trial results to read."""


class HarborTrial(BaseModel):
    task_name: str
    trial_name: str
    rewards: dict[str, float] | None = None
    exception_type: str | None = None
    exception_message: str = ""

    @property
    def outcome(self) -> OutcomeKind:
        return trial_outcome(self.rewards, self.exception_type)

    @property
    def reward(self) -> float | None:
        if not self.rewards:
            return None
        return self.rewards.get("reward", next(iter(self.rewards.values())) if len(self.rewards) == 1 else None)


def trial_outcome(rewards: dict[str, float] | None, exception_type: str | None) -> OutcomeKind:
    if exception_type is not None:
        return POLICY_FAULTS.get(exception_type, OutcomeKind.infra_error)
    if not rewards:
        return OutcomeKind.infra_error
    value = rewards.get("reward", next(iter(rewards.values())) if len(rewards) == 1 else None)
    if value is None:
        return OutcomeKind.infra_error
    return OutcomeKind.resolved if value >= 1.0 else OutcomeKind.unresolved


def read_trials(job_dir: Path) -> list[HarborTrial]:
    trials = []
    for path in sorted(job_dir.glob("*/result.json")):
        data = json.loads(path.read_text())
        exception = data.get("exception_info") or {}
        for step in data.get("step_results") or []:  # a multi-step trial: the first failure is the trial's
            exception = exception or (step.get("exception_info") or {})
        trials.append(HarborTrial(task_name=data.get("task_name", path.parent.name),
                                  trial_name=data.get("trial_name", path.parent.name),
                                  rewards=(data.get("verifier_result") or {}).get("rewards"),
                                  exception_type=exception.get("exception_type"),
                                  exception_message=tail(exception.get("exception_message", ""), 2000)))
    return trials


def run_harbor_job(venv: Path, tasks_dir: Path, jobs_dir: Path, job_name: str, *, agent: str = "oracle",
                   environment: str = "docker", docker_host: str | None = None, concurrency: int = 2,
                   extra_args: list[str] | None = None, timeout_s: float = 1800.0) -> list[HarborTrial]:
    """`harbor run -p tasks_dir -a agent -e environment` (an agent name, or a custom agent's import path
    "module:Class"; an environment type, or a custom environment's import path); returns its trials."""
    harbor = venv / "bin" / "harbor"
    if not harbor.is_file():
        raise HarborJobError(f"no Harbor CLI at {harbor}: run scripts/setup.sh where a Python >= 3.12 exists")
    argv = [str(harbor), "run", "-p", str(tasks_dir), "-a", agent, "-e", environment, "-o", str(jobs_dir),
            "--job-name", job_name, "-n", str(concurrency), "-q", "-y", *(extra_args or [])]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                              env=harbor_process_env(venv, docker_host))
    except subprocess.TimeoutExpired as exc:
        raise HarborJobError(f"harbor run {job_name} ran past {timeout_s:.0f}s") from exc
    trials = read_trials(jobs_dir / job_name)
    if not trials:
        raise HarborJobError(f"harbor run {job_name} exited {done.returncode} with no trial results: "
                             f"{tail(done.stdout + done.stderr)}")
    return trials
