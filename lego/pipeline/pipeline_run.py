"""A pipeline run in progress: one run's config, work dir, manifest, MLflow parent run and stage runner.

Flows look their run up by run id (`get_run`), so flow parameters stay plain values (run id, iteration)
and each stage reads its inputs from the run's manifest: the pipeline fills it stage after stage; `lego stage
NAME --from RUN` opens a run whose manifest holds RUN's results and reruns one stage on top of them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from lego.config import LegoConfig, flatten
from lego.data.writer import remove_stale_temp_files
from lego.errors import LegoError
from lego.pipeline.artifacts import StageContext, StageResult
from lego.pipeline.manifest import RunManifest, load_manifest, new_run_id, save_manifest
from lego.pipeline.policy import Policy
from lego.pipeline.progress import RunProgress, StoredRecords, follow
from lego.pipeline.report import stage_line
from lego.pipeline.rollout_stage import RolloutPlan
from lego.pipeline.runners import load_runner
from lego.pipeline.verify_stage import VerifyPlan
from lego.workdir import WorkDir

STAGES = ("taskset", "warmstart", "filter", "baseline", "rollout", "verify", "dataset", "train", "evaluate")
ITERATED = ("rollout", "verify", "dataset", "train", "evaluate")
# A line per finished stage, for a person (lego.pipeline.report.stage_line): `lego run` shows this logger's lines on
# the terminal, where the run's own log lines (`log`) are out of sight.
RUN_LOGGER = "lego.run"

_runs: dict[str, PipelineRun] = {}


class MissingUpstreamError(LegoError):
    """A stage's input is not in the run's manifest."""


class PipelineRun:
    def __init__(self, config: LegoConfig, work: WorkDir, *, run_id: str | None = None, resume: bool = False,
                 from_run: str | None = None, force: bool = False, log: Callable[[str], None] = print,
                 track: bool = True):
        self.config = config
        self.work = work
        self.log = log
        self.lock = threading.Lock()
        # A writer killed mid-file leaves a hidden temp file: readers never see it, but it takes space.
        stale = remove_stale_temp_files(work.data)
        if stale:
            log(f"removed {len(stale)} temp file(s) a killed writer left under {work.data}")
        if resume and run_id:
            self.manifest = load_manifest(work, run_id)
            self.manifest.status = "running"
        else:
            self.manifest = RunManifest(run_id=run_id or new_run_id(), created_at=datetime.now(UTC).isoformat(),
                                        config=config.model_dump(mode="json"), stage_impl=config.pipeline.runner)
            if from_run:
                source = load_manifest(work, from_run)
                self.manifest.from_run = source.run_id
                self.manifest.stages = {label: result.model_copy(update={"cached": True})
                                        for label, result in source.stages.items()}
        self.run_id = self.manifest.run_id
        self.progress = RunProgress(log)
        self.ctx = StageContext(config=config, work=work, run_id=self.run_id, runner=load_runner(config.pipeline.runner),
                                force=force, log=log, progress=self.progress)
        self.tracker = None
        if track:
            from lego.track.tracker import Tracker

            self.tracker = Tracker(config, work)
            tags = {"lego.from_run": self.manifest.from_run} if self.manifest.from_run else {}
            self.manifest.mlflow_run_id = self.tracker.start_pipeline_run(self.run_id, tags)
        save_manifest(work, self.manifest)
        self._initial_policy: Policy | None = None
        self.started = time.monotonic()
        _runs[self.run_id] = self

    # ------------------------------------------------------------------------------------------ inputs
    def result(self, stage: str, iteration: int | None = None) -> StageResult:
        found = self.manifest.get(stage, iteration)
        if found is None:
            label = stage if iteration is None else f"{stage}/{iteration}"
            source = f" (copied from {self.manifest.from_run})" if self.manifest.from_run else ""
            raise MissingUpstreamError(f"run {self.run_id}{source} has no {label} result; run the stages before it "
                                       f"(`lego run`, or `lego stage {stage}` from a run that has them)")
        return found

    def task_list(self) -> StageResult:
        """The filter's kept tasks when the filter is on, else the training tasks."""
        if self.config.filter.enabled:
            return self.result("filter")
        return self.result("taskset")

    def initial_policy(self) -> Policy:
        if self._initial_policy is None:
            from lego.engine.checkpoint import default_model_path, init_tiny_model

            path = default_model_path(self.config, self.work)
            if self.config.model.path is None:  # written once per spec and seed; a rerun only reads its marker
                if not (path / "config.json").is_file():
                    self.log(f"policy: writing the tiny random-init checkpoint to {path}")
                init_tiny_model(self.config.model.init, path, seed=self.config.project.seed, on_progress=self.log)
            self._initial_policy = Policy.from_path(path)
        return self._initial_policy

    def policy(self, iteration: int) -> Policy:
        """The policy that iteration `iteration` samples from (after `iteration` updates): iteration 0 samples from
        the warm start's policy when the warm start is on, else from the initial checkpoint."""
        if iteration == 0:
            if self.config.warmstart.enabled:
                return Policy.from_data(self.result("warmstart").data)
            return self.initial_policy()
        return Policy.from_data(self.result("train", iteration - 1).data)

    def follow_rollouts(self, plan: RolloutPlan, wait: Callable[[float], bool]) -> None:
        """Show the rollout stage's progress while its shards run (in this process or others: counted from what
        they store) until `wait(timeout)` returns True (every shard is over)."""
        self._follow(f"rollout/{plan.iteration}", "done", plan.data_run_id, "rollout", plan.iteration, "rollouts",
                     [request.rollout_id for request in plan.requests], wait)

    def follow_grading(self, plan: VerifyPlan, wait: Callable[[float], bool]) -> None:
        """The same for the verify stage's grading shards, counted from the outcomes they store."""
        self._follow(f"verify/{plan.iteration}", "graded", plan.data_run_id, plan.outcome_stage, plan.iteration,
                     "outcomes", plan.todo, wait)

    def _follow(self, label: str, verb: str, data_run_id: str, stage: str, iteration: int, table: str,
                wanted: list[str], wait: Callable[[float], bool]) -> None:
        from lego.data.writer import DatasetWriter

        counter = StoredRecords(DatasetWriter(self.work, data_run_id).directory(stage, iteration), wanted, table)
        done, counts = counter.poll()
        progress = self.progress.start(label, len(wanted), done=done, counts=counts, verb=verb)
        follow(progress, counter, wait, stall_s=self.config.pipeline.stall_timeout_s)

    # ------------------------------------------------------------------------------------------ outputs
    def record(self, result: StageResult) -> StageResult:
        """Add a stage result to the manifest and MLflow (a nested run; cached outputs are linked, not copied)."""
        stage_run = None
        with self.lock:
            self.manifest.record(result)
            save_manifest(self.work, self.manifest)
            if self.tracker is not None and self.manifest.mlflow_run_id:
                stage_run = self._track(result)
        if stage_run is not None and not result.cached:
            # Here, not in the stage: the traces are a view of what the stage stored, so their code stays out of
            # the stage's content key (lego/pipeline/keys.py); a cache hit writes none (the run that computed the
            # result holds them).
            from lego.track.traces import log_result_traces

            log_result_traces(self.tracker, run_id=self.run_id, stage=result.stage, iteration=result.iteration,
                              data=result.data, stage_run=stage_run, pipeline_run=self.manifest.mlflow_run_id)
        state = "cached" if result.cached else f"{result.seconds:.1f}s"
        self.log(f"{result.label()}: done ({state}) -> {result.path}")
        logging.getLogger(RUN_LOGGER).info(stage_line(result))
        return result

    def _track(self, result: StageResult) -> str:
        tracker = self.tracker
        run = tracker.start_stage_run(self.manifest.mlflow_run_id, self.run_id, result.stage, result.iteration)
        policy_version = result.data.get("policy_version")
        tracker.set_tags(run, {"lego.artifact_key": result.key, "lego.artifact_path": result.path,
                               "lego.cached": str(result.cached).lower(),
                               **({"lego.policy_version": policy_version} if policy_version is not None else {}),
                               **({"lego.data_run_id": result.data["data_run_id"]}
                                  if "data_run_id" in result.data else {})})
        params = {f"input.{k}": v for k, v in flatten({k: v for k, v in result.inputs.items()}).items()}
        tracker.log_params(run, params)
        tracker.log_metrics(run, {**result.metrics, "stage_seconds": result.seconds}, step=result.iteration or 0)
        # Here, not in the stage (as the traces below): read back from the artifact, so a cached result logs
        # the same series, and the logging code stays out of the stage's content key.
        from lego.track.steps import log_stage_steps

        stepwise = log_stage_steps(tracker, result.stage, result.outputs, stage_run=run,
                                   pipeline_run=self.manifest.mlflow_run_id)
        tracker.log_outputs(run, {name: path for name, path in result.outputs.items()}, copy=not result.cached)
        tracker.end(run)
        # The parent run gets the per-iteration curve of each stage metric (step = iteration), except the names
        # whose per-step curve it got just now (step = optimizer step): one metric name, one axis.
        prefixed = {f"{result.stage}.{name}": value for name, value in result.metrics.items() if name not in stepwise}
        tracker.log_metrics(self.manifest.mlflow_run_id, prefixed, step=result.iteration or 0)
        return run

    def finish(self, status: str = "completed", summary: dict[str, Any] | None = None) -> RunManifest:
        from lego.engine.pool import close_engines

        close_engines()  # the engine the run's stages shared (lego.engine.pool)
        self.progress.close()
        self.manifest.status = status
        self.manifest.summary = {**(summary or {}), "seconds": round(time.monotonic() - self.started, 1)}
        save_manifest(self.work, self.manifest)
        if self.tracker is not None and self.manifest.mlflow_run_id:
            self.tracker.end(self.manifest.mlflow_run_id, "FINISHED" if status == "completed" else "FAILED")
        _runs.pop(self.run_id, None)
        return self.manifest


def get_run(run_id: str) -> PipelineRun:
    try:
        return _runs[run_id]
    except KeyError:
        raise LegoError(f"no open pipeline run {run_id!r} in this process; start the stage through "
                        "`lego run` or `lego stage`") from None
