"""Evaluating a policy: on a task set, with one or more harnesses, at the evaluation temperature, graded by the
verifier. `lego eval` and the pipeline's evaluate (and baseline) stage both run `evaluate_policy`.

Per harness: every (task, sample) is attempted (stored under the harness's data run, so a rerun resumes where it
stopped and only grades what has no outcome yet), every attempt graded in a fresh sandbox, and the outcomes
summarized (lego.evaluate.report): the resolved rate with its Wilson interval over the graded attempts, per repo;
infrastructure failures are retried where they happen (rollout.infra_retries, verify.infra_retries), then counted
apart with the check that named them, and an evaluation that graded fewer than eval.min_coverage of its planned
attempts reports its shortfall instead of a rate.

The policy is a checkpoint, a run's policy version, or a scripted one (tests, sanity checks of a task set): `gold`
answers each task with its gold patch in the harness's own tools, `empty` finishes without changing anything; a
scripted policy's tokens are scored by a checkpoint (its log-probs and routing are real), which it is no test of.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from lego.cache import content_hash
from lego.config import LegoConfig
from lego.data.catalog import Catalog
from lego.data.codec import EvalResult
from lego.data.writer import DatasetWriter
from lego.errors import ConfigError, LegoError
from lego.evaluate.report import EvalReport, summarize_outcomes
from lego.pipeline.artifacts import StageContext
from lego.pipeline.attempts import run_attempts
from lego.pipeline.grading import grade_attempts
from lego.pipeline.policy import Policy
from lego.pipeline.runners import RealRunner, StageRunner
from lego.records import Outcome
from lego.rollout.requests import EVALUATION_ROUND, round_seed
from lego.tasksets.task import Task

Scripted = Literal["gold", "empty"]
# What the empty policy runs with the harness's own shell tool before finishing: it reads, it changes nothing.
NO_CHANGE_COMMAND = "git status --short"


class EvalError(LegoError):
    """An evaluation cannot be set up as asked (its policy, harnesses or task set)."""


class EvalPolicy(BaseModel):
    """What is evaluated: a checkpoint (`scripted` None), or a scripted policy scored by the checkpoint."""

    path: Path
    version: int
    key: str
    scripted: Scripted | None = None
    source: str = ""  # how the user named it: a path, "run R policy N", "gold"

    @property
    def label(self) -> str:
        return self.scripted or f"v{self.version}"

    @property
    def identity(self) -> str:
        """What makes two evaluations of it the same: the checkpoint's content, and the script if any."""
        return self.key if self.scripted is None else f"{self.scripted}:{self.key}"

    def as_policy(self) -> Policy:
        return Policy(self.path, self.version, self.key)

    @classmethod
    def of(cls, policy: Policy, scripted: Scripted | None = None, source: str = "") -> EvalPolicy:
        return cls(path=policy.path, version=policy.version, key=policy.key, scripted=scripted,
                   source=source or str(policy.path))


class HarnessEvaluation(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    harness: str
    data_run_id: str
    report: EvalReport
    outcomes: list[Outcome] = Field(default_factory=list, exclude=True)


class PolicyEvaluation(BaseModel):
    """One policy on one task set, per harness."""

    policy: EvalPolicy
    temperature: float
    samples_per_task: int
    task_ids: list[str]
    harnesses: dict[str, HarnessEvaluation]

    @property
    def covered(self) -> bool:
        return all(result.report.covered for result in self.harnesses.values())


# ---------------------------------------------------------------------------------------------- policies


def checkpoint_policy(path: str | Path) -> EvalPolicy:
    path = Path(path).expanduser()
    if not (path / "config.json").is_file():
        raise EvalError(f"{path} is not a policy checkpoint (no config.json there); pass a checkpoint directory, "
                        "or --run RUN --policy-version N for a run's policy")
    return EvalPolicy.of(Policy.from_path(path.resolve()), source=str(path))


def run_policy(work, run_id: str, version: int) -> EvalPolicy:
    """Policy `version` of a pipeline run: 0 is the one its RL started from, i the one after iteration i-1."""
    from lego.pipeline.manifest import load_manifest

    manifest = load_manifest(work, run_id)
    found: dict[int, Policy] = {}
    for result in manifest.stages.values():
        data = result.data
        if "policy_path" in data and "policy_version" in data and "policy_key" in data:
            found.setdefault(int(data["policy_version"]), Policy.from_data(data))
    if version not in found:
        known = ", ".join(str(v) for v in sorted(found)) or "none"
        raise EvalError(f"run {manifest.run_id} has no policy version {version} (its stages name versions: "
                        f"{known}); pass one of those to --policy-version")
    policy = found[version]
    if not (policy.path / "config.json").is_file():
        raise EvalError(f"run {manifest.run_id}'s policy {version} was at {policy.path}, which no longer holds a "
                        "checkpoint; rerun that run's train stage (`lego stage train --from RUN`)")
    return EvalPolicy.of(policy, source=f"run {manifest.run_id} policy {version}")


def scripted_policy(kind: Scripted, config: LegoConfig, work) -> EvalPolicy:
    """A scripted policy scored by the configured checkpoint (the tiny random-init one is written if missing)."""
    from lego.engine.checkpoint import default_model_path, init_tiny_model

    path = default_model_path(config, work)
    if not (path / "config.json").is_file():
        if config.model.path is not None:
            raise EvalError(f"model.path {path} holds no checkpoint to score the {kind} policy's tokens with")
        init_tiny_model(config.model.init, path, seed=config.project.seed)
    return EvalPolicy.of(Policy.from_path(path), scripted=kind, source=kind)


# ---------------------------------------------------------------------------------------------- harness configs


def eval_temperature(config: LegoConfig) -> float:
    return config.sampling.temperature if config.eval.temperature is None else config.eval.temperature


# A scripted policy's replies are not sampled: a cap on sampled tokens must not cut them (a gold patch cut short is
# a broken tool call). Beyond the longest bundled gold reply, as lego bench rollout allows.
SCRIPTED_MAX_TOKENS = 2048


def harness_config(config: LegoConfig, harness: str, scripted: Scripted | None = None) -> LegoConfig:
    """The config an evaluation attempt runs with: `harness` (the configured harness's version and extras only
    when it is that one) sampling at the evaluation temperature."""
    from lego.harness.base import get_harness

    get_harness(harness)  # an unknown name fails here, naming the known ones
    settings = config.harness
    if harness != settings.name:
        settings = settings.model_copy(update={"name": harness, "version": None, "extra": {}})
    sampling = config.sampling.model_copy(update={"temperature": eval_temperature(config)})
    if scripted is not None:
        sampling = sampling.model_copy(update={"max_tokens": max(sampling.max_tokens, SCRIPTED_MAX_TOKENS)})
    return config.model_copy(update={"harness": settings, "sampling": sampling})


# ---------------------------------------------------------------------------------------------- the empty policy


class EmptyPolicyRunner:
    """The real stack with a scripted policy that runs one harmless command with the harness's own shell tool and
    finishes: every attempt hands in an empty diff. What a task set's graders must call unresolved."""

    def __init__(self, inner: StageRunner) -> None:
        if not isinstance(inner, RealRunner):
            raise EvalError("the empty scripted policy runs on the real rollout stack; unset pipeline.runner "
                            f"(it is {type(inner).__name__})")
        self.inner = inner

    def rollout(self, ctx, tasks, requests, policy, *, stage, iteration, writer, gold=False) -> None:  # noqa: ARG002
        from lego.engine.pool import lease_engine
        from lego.engine.scripted import ScriptedEngine
        from lego.engine.tokenizer import load_tokenizer
        from lego.harness.base import get_harness
        from lego.rollout.batch import run_rollouts
        from lego.termination import run_until_terminated

        replies = get_harness(ctx.config.harness.name).gold_replies(NO_CHANGE_COMMAND)
        tokenizer = load_tokenizer()
        with lease_engine(ctx.config, policy.path, policy.version, lambda line: ctx.log(f"{stage}: {line}")) as engine:
            run_until_terminated(run_rollouts(requests, tasks, ctx.config, ctx.work, engine, writer=writer,
                                              stage=stage, iteration=iteration,
                                              engine_for=lambda task: ScriptedEngine(engine, tokenizer, replies)))

    @contextlib.contextmanager
    def grader(self, ctx) -> Iterator:
        with self.inner.grader(ctx) as grade:
            yield grade


# ---------------------------------------------------------------------------------------------- evaluating


def _rollout_stats(ctx: StageContext, data_run_id: str, stage: str, iteration: int) -> dict[str, tuple[int, int]]:
    with Catalog.open(ctx.work, ctx.config, in_memory=True) as catalog:
        rows = catalog.rows("SELECT rollout_id, num_turns, num_tokens FROM rollouts WHERE run_id = ? AND "
                            "stage = ? AND iteration = ?", [data_run_id, stage, iteration])
    return {row["rollout_id"]: (int(row["num_turns"] or 0), int(row["num_tokens"] or 0)) for row in rows}


def evaluate_harness(ctx: StageContext, tasks: Sequence[Task], policy: EvalPolicy, harness: str, *,
                     data_run_id: str, stage: str = "evaluate", iteration: int = 0, samples: int | None = None,
                     label: str | None = None) -> HarnessEvaluation:
    """`samples` attempts (default eval.samples_per_task) of each task with `harness`, graded and summarized."""
    if not tasks:
        raise EvalError("no task to evaluate on; check tasks.source, the split, and eval.limit")
    samples = samples or ctx.config.eval.samples_per_task
    config = harness_config(ctx.config, harness, policy.scripted)
    runner = EmptyPolicyRunner(ctx.runner) if policy.scripted == "empty" else ctx.runner
    hctx = replace(ctx, config=config, runner=runner)
    label = label or f"{stage}/{iteration} {harness}"
    # Every evaluation of the run draws the same random numbers for the same task and sample (paired attempts).
    run_attempts(hctx, tasks, policy.as_policy(), samples=samples, data_run_id=data_run_id, stage=stage,
                 iteration=iteration, gold=policy.scripted == "gold", label=label,
                 seed=round_seed(ctx.config.project.seed, EVALUATION_ROUND))
    outcomes = grade_attempts(hctx, tasks, data_run_id=data_run_id, rollout_stage=stage,
                              outcome_stage=f"{stage}-verify", iteration=iteration, label=f"{label} grading")
    wanted = {task.instance_id for task in tasks}
    outcomes = [outcome for outcome in outcomes if outcome.task_id in wanted]
    settings = ctx.config.eval
    report = summarize_outcomes(outcomes, _rollout_stats(hctx, data_run_id, stage, iteration), harness=harness,
                                policy_version=policy.version, confidence=settings.confidence,
                                planned=len(tasks) * samples, min_coverage=settings.min_coverage,
                                repos={task.instance_id: task.repo for task in tasks})
    DatasetWriter(ctx.work, data_run_id).append_eval_results(
        [EvalResult(o.task_id, harness, policy.version, o.kind, o.rollout_id) for o in outcomes], iteration)
    return HarnessEvaluation(harness=harness, data_run_id=data_run_id, report=report, outcomes=outcomes)


def evaluate_policy(ctx: StageContext, tasks: Sequence[Task], policy: EvalPolicy, *,
                    data_run_ids: Mapping[str, str], stage: str = "evaluate", iteration: int = 0,
                    samples: int | None = None, label: Callable[[str], str] | None = None) -> PolicyEvaluation:
    """`policy` on `tasks` with each harness of `data_run_ids` (harness -> the data run its attempts are stored
    under), one after the other."""
    if not data_run_ids:
        raise EvalError("no harness to evaluate with; name one or more (--harness NAME)")
    samples = samples or ctx.config.eval.samples_per_task
    results = {harness: evaluate_harness(ctx, tasks, policy, harness, data_run_id=data_run_id, stage=stage,
                                         iteration=iteration, samples=samples,
                                         label=label(harness) if label else None)
               for harness, data_run_id in data_run_ids.items()}
    return PolicyEvaluation(policy=policy, temperature=eval_temperature(ctx.config), samples_per_task=samples,
                            task_ids=[task.instance_id for task in tasks], harnesses=results)


# ---------------------------------------------------------------------------------------------- `lego eval`


def eval_tasks(config: LegoConfig, split: str | None = None, limit: int | None = None) -> list[Task]:
    """The tasks `lego eval` runs on: the configured task set's `split` (default tasks.eval_split), sorted by id,
    the first `limit` (default eval.limit): the pipeline's evaluation list."""
    from lego.tasksets.load import load_tasks

    split = split or config.tasks.eval_split
    if split not in ("train", "eval", "all"):
        raise ConfigError(f"split {split!r} is not one of train, eval, all")
    loaded = load_tasks(config.tasks.source, split="all", strict=config.tasks.strict)
    chosen = sorted((task for task in loaded.tasks if split == "all" or task.split == split),
                    key=lambda task: task.instance_id)
    limit = limit or config.eval.limit
    return chosen[:limit] if limit else chosen


def evaluation_key(ctx: StageContext, tasks: Sequence[Task], policy: EvalPolicy, harness: str, samples: int) -> str:
    """The content key of one harness's evaluation: same key, same stored attempts (a rerun resumes them)."""
    from lego.pipeline.keys import code_version, key_of
    from lego.pipeline.rollout_stage import rollout_settings
    from lego.pipeline.verify_stage import grading_settings

    hctx = replace(ctx, config=harness_config(ctx.config, harness, policy.scripted))
    return key_of({"stage": "eval", "code": code_version("evaluate"), "policy": policy.identity,
                   "tasks": content_hash(*(task.model_dump_json() for task in tasks)), "samples": samples,
                   "eval": ctx.config.section_dict("eval"), **rollout_settings(hctx), **grading_settings(hctx)})


def new_eval_id() -> str:
    from lego.pipeline.manifest import new_run_id

    return "eval-" + new_run_id().removeprefix("run-")


def run_eval(ctx: StageContext, tasks: Sequence[Task], policy: EvalPolicy, harnesses: Sequence[str], *,
             samples: int | None = None, fresh: bool = False) -> tuple[PolicyEvaluation, dict[str, str]]:
    """`lego eval`: the evaluation, its attempts stored under content-keyed data runs (`fresh`: under new ones,
    so that nothing stored earlier counts). Returns it and the content key per harness."""
    import time

    samples = samples or ctx.config.eval.samples_per_task
    names = list(dict.fromkeys(harnesses))
    keys = {harness: evaluation_key(ctx, tasks, policy, harness, samples) for harness in names}
    stamp = f"-{time.time_ns() // 1_000_000:x}" if fresh else ""
    data_run_ids = {harness: f"eval-{harness}-{keys[harness][:12]}{stamp}" for harness in names}
    evaluation = evaluate_policy(ctx, tasks, policy, data_run_ids=data_run_ids, samples=samples,
                                 label=lambda harness: f"eval {policy.label} {harness}")
    return evaluation, keys
