"""What each panel of the dashboard shows, read from a run's manifest, `lego status`'s diagnosis and the catalog.

A refresh builds a `RunState` (the manifest, the diagnosis, the data runs the run stored) and then only the models
of what is on screen. Nothing here writes or renders: the catalog is opened in memory (a live run may hold the
catalog file's lock) and closed again within each call; lego.ui.panels turns the models into Dash components.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from lego.config import LegoConfig
from lego.data import queries
from lego.data.catalog import Catalog
from lego.errors import LegoError
from lego.pipeline.artifacts import StageResult
from lego.pipeline.diagnosis import PEARSON_MIN, Diagnosis, Finding, LiveStage, diagnose, run_config
from lego.pipeline.manifest import RunManifest, load_manifest, runs_dir
from lego.records import REWARD, OutcomeKind
from lego.workdir import WorkDir

NOT_GRADED = "not_graded"
OUTCOME_KINDS = [kind.value for kind in OutcomeKind] + [NOT_GRADED]
LOG_ROLLOUTS = 500  # newest rollouts and gradings the log lists (each)
HARNESS_RUNS = 20  # runs the harness comparison reads when the dashboard serves every run of the work dir
FIDELITY_METRICS = {"pearson": "logprob_pearson", "kl": "kl_to_inference", "abs_diff_mean": "logprob_abs_diff_mean",
                    "abs_diff_max": "logprob_abs_diff_max", "routing_differs_share": "routing_differs_share"}
STAGE_SUMMARY = {  # the metrics a stage's line in the overview and the log shows
    "taskset": ("train_tasks", "eval_tasks"), "filter": ("tasks", "kept"),
    "warmstart": ("demonstrations", "steps", "final_loss"), "rollout": ("rollouts", "mean_turns", "mean_tokens"),
    "verify": ("graded", "outcome.resolved", "resolved_rate", "infra_error_rate", "cheat_rate"),
    "dataset": ("groups_in_loss", "groups_with_signal", "mean_reward"),
    "train": ("loss", "logprob_pearson", "optimizer_steps", "learning_rate"),
    "baseline": ("resolved", "attempts", "train.resolved", "train.attempts"),
    "evaluate": ("resolved", "attempts", "train.resolved", "train.attempts"),
}

Purpose = Literal["rollout", "evaluation", "filter", "warmstart", "other"]


def list_runs(work: WorkDir) -> list[str]:
    """The runs of a work dir, newest manifest first."""
    manifests = sorted(runs_dir(work).glob("*/manifest.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    return [path.parent.name for path in manifests]


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _iso(value: Any) -> str | None:
    if value is None:
        return None
    return value.isoformat() if isinstance(value, datetime) else str(value)


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if number != number else number  # NaN


def _short(values: dict[str, float], names: tuple[str, ...]) -> str:
    parts = []
    for name in names:
        if (value := _number(values.get(name))) is not None:
            shown = f"{value:g}" if value == int(value) or abs(value) >= 1000 else f"{value:.4g}"
            parts.append(f"{name} {shown}")
    return ", ".join(parts)


# ---------------------------------------------------------------------------------------------- the run's data


class DataRun(BaseModel):
    """One set of rollouts a pipeline run stored (<work>/data/<data_run_id>/<stage>/iter=<iteration>)."""

    data_run_id: str
    stage: str  # the data stage: rollout, evaluate, filter, warmstart
    iteration: int
    label: str  # what the dashboard calls it: rollout/1, evaluate/0 (eval split), rollout/2 (in progress)
    purpose: Purpose
    split: str | None = None  # an evaluation's split
    policy_version: int | None = None
    live: bool = False  # its stage is in progress (no result in the manifest yet)


def data_runs(manifest: RunManifest, live: list[LiveStage]) -> list[DataRun]:
    """The data runs of a run's recorded stages (their `data` names them), then those of the stage in progress."""
    out: list[DataRun] = []
    for label, result in manifest.stages.items():
        data = result.data
        version = data.get("policy_version")
        iteration = result.iteration or 0
        if result.stage == "rollout" and data.get("data_run_id"):
            out.append(DataRun(data_run_id=data["data_run_id"], stage=data.get("stage", "rollout"),
                               iteration=iteration, label=label, purpose="rollout", policy_version=version))
        elif result.stage in ("baseline", "evaluate"):
            # lego/pipeline/evaluate_stage.py: `data_run_id` for the eval split, `data_run_id_train` for the train one
            for key, split in (("data_run_id", "eval"), ("data_run_id_train", "train")):
                if data.get(key):
                    out.append(DataRun(data_run_id=data[key], stage="evaluate", iteration=iteration,
                                       label=f"{label} ({split} split)", purpose="evaluation", split=split,
                                       policy_version=version))
        elif result.stage in ("filter", "warmstart") and data.get("data_run_id"):
            out.append(DataRun(data_run_id=data["data_run_id"], stage=result.stage, iteration=0, label=label,
                               purpose=result.stage, policy_version=version))
    known = {(run.data_run_id, run.stage, run.iteration) for run in out}
    for stage in live:
        if (stage.data_run_id, stage.stage, stage.iteration) in known:
            continue
        purpose: Purpose = {"rollout": "rollout", "evaluate": "evaluation", "filter": "filter",
                            "warmstart": "warmstart"}.get(stage.stage, "other")
        out.append(DataRun(data_run_id=stage.data_run_id, stage=stage.stage, iteration=stage.iteration,
                           label=f"{stage.stage}/{stage.iteration} (in progress)", purpose=purpose, live=True))
    return out


def train_data_run_id(result: StageResult) -> str:
    """Where a train stage wrote its steps (lego/pipeline/train_stage.py: `train-` and its artifact key's start)."""
    return f"train-{result.dir.name[:16]}"


@dataclass
class RunState:
    """One refresh's view of a run: its manifest, the config it ran with, `lego status`'s diagnosis, its data."""

    work: WorkDir
    settings: LegoConfig
    manifest: RunManifest
    diagnosis: Diagnosis
    runs: list[DataRun]

    def ids(self, *purposes: Purpose) -> list[str]:
        return sorted({run.data_run_id for run in self.runs if not purposes or run.purpose in purposes})

    def catalog(self) -> Catalog:
        return Catalog.open(self.work, self.settings, in_memory=True)

    def train_results(self) -> list[StageResult]:
        return sorted((r for r in self.manifest.stages.values() if r.stage == "train"), key=lambda r: r.iteration or 0)


def load_run(work: WorkDir, config: LegoConfig, run_id: str) -> RunState:
    """`run_id`: a run of the work dir, or 'latest'. Raises RunNotFoundError (a LegoError) when there is none."""
    diagnosis = diagnose(work, config, run_id)
    manifest = load_manifest(work, diagnosis.run_id)
    settings, _ = run_config(manifest, config)
    return RunState(work, settings, manifest, diagnosis, data_runs(manifest, diagnosis.live))


# ---------------------------------------------------------------------------------------------- train steps


class StepPoint(BaseModel):
    """One optimizer step (or one train stage's summary row) on the run's global step axis."""

    step: int
    iteration: int
    policy_version: int | None = None
    loss: float | None = None
    metrics: dict[str, float] = Field(default_factory=dict)


def global_steps(rows: list[dict[str, Any]]) -> list[StepPoint]:
    """Train-step rows (iteration, step order) on one axis. A trainer that starts counting again in each train
    stage gets the previous stages' steps added; one whose count goes on across stages keeps its own."""
    points: list[StepPoint] = []
    last = 0
    by_iteration: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_iteration[int(row["iteration"])].append(row)
    for iteration in sorted(by_iteration):
        group = by_iteration[iteration]
        offset = 0 if min(int(r["step"]) for r in group) > last else last
        for row in group:
            metrics = {name: value for name, value in (row.get("metrics") or {}).items() if _number(value) is not None}
            points.append(StepPoint(step=offset + int(row["step"]), iteration=iteration,
                                    policy_version=row.get("policy_version"), loss=_number(row.get("loss")),
                                    metrics=metrics))
        last = max(point.step for point in points)
    return points


def _steps(state: RunState, catalog: Catalog) -> list[StepPoint]:
    return global_steps(queries.train_steps(catalog, sorted({train_data_run_id(r) for r in state.train_results()})))


# ---------------------------------------------------------------------------------------------- header


class Header(BaseModel):
    run_id: str
    status: str
    created_at: str
    checked_at: str
    harness: str
    model: str
    elapsed_s: float | None = None
    current_stage: str | None = None
    stages_done: int = 0
    stages_left: int = 0
    iteration: int | None = None
    step: int = 0
    last_progress_at: str | None = None
    minutes_since_progress: float | None = None
    last_progress_source: str | None = None
    ended_at: str | None = None  # a finished run's last recorded stage
    errors: int = 0
    warnings: int = 0
    mlflow_run_id: str | None = None


def _elapsed(state: RunState, now: datetime) -> float | None:
    started = _parse_time(state.manifest.created_at)
    if started is None:
        return None
    if state.manifest.status == "running":
        return (now - started).total_seconds()
    if (seconds := _number(state.manifest.summary.get("seconds"))) is not None:
        return seconds
    ends = [t for r in state.manifest.stages.values() if (t := _parse_time(r.created_at))]
    return (max(ends) - started).total_seconds() if ends else None


def header(state: RunState, steps: list[StepPoint] | None = None) -> Header:
    diagnosis = state.diagnosis
    now = _parse_time(diagnosis.checked_at) or datetime.now(UTC)
    if steps is None:
        with state.catalog() as catalog:
            steps = _steps(state, catalog)
    iteration = None
    if diagnosis.current_stage and "/" in diagnosis.current_stage:
        iteration = int(diagnosis.current_stage.split("/")[1])
    elif (iterations := [r.iteration for r in state.manifest.stages.values() if r.iteration is not None]):
        iteration = max(iterations)
    return Header(run_id=state.manifest.run_id, status=state.manifest.status, created_at=state.manifest.created_at,
                  checked_at=diagnosis.checked_at, harness=state.settings.harness.name,
                  model=state.settings.model.name, elapsed_s=_elapsed(state, now),
                  current_stage=diagnosis.current_stage, stages_done=len(diagnosis.stages_done),
                  stages_left=len(diagnosis.stages_left), iteration=iteration,
                  step=max((point.step for point in steps), default=0),
                  last_progress_at=diagnosis.last_progress_at,
                  minutes_since_progress=diagnosis.minutes_since_progress,
                  last_progress_source=diagnosis.last_progress_source,
                  ended_at=None if state.manifest.status == "running" else
                  max((r.created_at for r in state.manifest.stages.values()), default=None),
                  errors=sum(1 for f in diagnosis.findings if f.severity == "error"),
                  warnings=sum(1 for f in diagnosis.findings if f.severity == "warning"),
                  mlflow_run_id=state.manifest.mlflow_run_id)


# ---------------------------------------------------------------------------------------------- overview


class Rate(BaseModel):
    resolved: int
    attempts: int
    rate: float
    low: float
    high: float


class CurvePoint(BaseModel):
    """lego.pipeline.learning's resolved rates of one policy (0: RL's start, i+1: after iteration i)."""

    policy: int
    train_split: Rate | None = None  # the rollout stage's own graded samples at this policy
    train_split_eval: Rate | None = None
    eval_split: Rate | None = None


class RewardPoint(BaseModel):
    label: str
    iteration: int
    rollouts: int
    graded: int  # rollouts with a reward (infra errors and ungraded ones have none)
    resolved: int
    mean_reward: float | None
    live: bool = False


class StageRow(BaseModel):
    label: str
    seconds: float
    created_at: str
    cached: bool
    summary: str


class Overview(BaseModel):
    header: Header
    curve: list[CurvePoint]
    rewards: list[RewardPoint]
    steps: list[StepPoint]
    stages: list[StageRow]
    findings: list[Finding]
    notes: list[str]


def _kinds(rows: list[dict[str, Any]]) -> dict[tuple[str, str, int], dict[str, int]]:
    """outcome_counts rows -> per (data run, stage, iteration): kind -> rollouts."""
    out: dict[tuple[str, str, int], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for row in rows:
        out[(row["run_id"], row["stage"], int(row["iteration"]))][row["kind"]] += int(row["rollouts"])
    return out


def mean_reward(kinds: dict[str, int]) -> tuple[int, float | None]:
    """(graded, mean reward) of outcome counts, with the loss's rewards (lego.records.REWARD; infra errors and
    ungraded rollouts have none)."""
    graded = total = 0.0
    for kind, count in kinds.items():
        reward = REWARD.get(OutcomeKind(kind)) if kind != NOT_GRADED else None
        if reward is not None:
            graded += count
            total += reward * count
    return int(graded), (total / graded if graded else None)


def overview(state: RunState) -> Overview:
    with state.catalog() as catalog:
        steps = _steps(state, catalog)
        counts = _kinds(queries.outcome_counts(catalog, state.ids("rollout")))
    rewards = []
    for run in state.runs:
        if run.purpose != "rollout":
            continue
        kinds = counts.get((run.data_run_id, run.stage, run.iteration), {})
        graded, mean = mean_reward(kinds)
        rewards.append(RewardPoint(label=run.label, iteration=run.iteration, rollouts=sum(kinds.values()),
                                   graded=graded, resolved=kinds.get("resolved", 0), mean_reward=mean,
                                   live=run.live))
    curve = [CurvePoint(policy=point["policy"],
                        **{name: Rate(**{k: point[name][k] for k in Rate.model_fields})
                           for name in ("train_split", "train_split_eval", "eval_split") if point.get(name)})
             for point in state.diagnosis.curve]
    stages = [StageRow(label=label, seconds=result.seconds, created_at=result.created_at, cached=result.cached,
                       summary=_short(result.metrics, STAGE_SUMMARY.get(result.stage, ())))
              for label, result in state.manifest.stages.items()]
    return Overview(header=header(state, steps), curve=curve, rewards=rewards, steps=steps, stages=stages,
                    findings=state.diagnosis.findings, notes=state.diagnosis.notes)


# ---------------------------------------------------------------------------------------------- rollouts (live)


class StageProgress(BaseModel):
    label: str
    data_run_id: str
    stage: str
    iteration: int
    purpose: Purpose
    live: bool
    planned: int | None  # rollout stages: tasks x rollout.samples_per_task
    stored: int  # rollouts done (each is stored as it ends)
    graded: int
    left: int | None
    running: int | None  # at most this many run now: rollout.concurrency at a time per worker
    outcomes: dict[str, int]
    mean_turns: float | None
    mean_tokens: float | None
    last_write: str | None


class HarnessOutcomes(BaseModel):
    harness: str
    rollouts: int
    outcomes: dict[str, int]
    mean_reward: float | None


class RolloutsPanel(BaseModel):
    status: str
    current_stage: str | None
    last_progress_at: str | None
    minutes_since_progress: float | None
    concurrency: int
    stages: list[StageProgress]  # newest first
    harnesses: list[HarnessOutcomes]
    live: list[LiveStage]  # the diagnosis's view of the stage in progress
    findings: list[Finding]


def planned_rollouts(state: RunState) -> int | None:
    """A rollout stage's planned rollouts: the filter's kept tasks (or the train tasks) x samples per task."""
    manifest = state.manifest
    tasks = None
    if (filtered := manifest.stages.get("filter")) is not None:
        tasks = _number(filtered.metrics.get("kept"))
    elif (taskset := manifest.stages.get("taskset")) is not None:
        tasks = _number(taskset.metrics.get("train_tasks"))
    return int(tasks) * state.settings.rollout.samples_per_task if tasks is not None else None


def rollouts(state: RunState) -> RolloutsPanel:
    with state.catalog() as catalog:
        rows = queries.outcome_counts(catalog, state.ids())
    wanted = {(run.data_run_id, run.stage, run.iteration): run for run in state.runs}
    per_stage: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    by_harness: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for row in rows:
        key = (row["run_id"], row["stage"], int(row["iteration"]))
        if key in wanted:
            per_stage[key].append(row)
            if wanted[key].purpose == "rollout":
                by_harness[row["harness"] or "?"][row["kind"]] += int(row["rollouts"])
    planned = planned_rollouts(state)
    concurrency = state.settings.rollout.concurrency
    stages = []
    for key, run in wanted.items():
        group = per_stage.get(key, [])
        outcomes: dict[str, int] = defaultdict(int)
        for row in group:
            outcomes[row["kind"]] += int(row["rollouts"])
        stored = sum(outcomes.values())
        graded, _ = mean_reward(outcomes)
        plan = planned if run.purpose == "rollout" else None
        left = max(plan - stored, 0) if plan is not None else None
        running = min(left, concurrency) if left is not None and run.live else None
        last = max((row["last_write"] for row in group if row["last_write"] is not None), default=None)
        stages.append(StageProgress(
            label=run.label, data_run_id=run.data_run_id, stage=run.stage, iteration=run.iteration,
            purpose=run.purpose, live=run.live, planned=plan, stored=stored, graded=graded, left=left,
            running=running, outcomes={k: outcomes[k] for k in OUTCOME_KINDS if outcomes.get(k)},
            mean_turns=sum(int(r["turns"]) for r in group) / stored if stored else None,
            mean_tokens=sum(int(r["tokens"]) for r in group) / stored if stored else None,
            last_write=_iso(last)))
    stages.sort(key=lambda s: (s.live, s.last_write or ""), reverse=True)
    harnesses = [HarnessOutcomes(harness=name, rollouts=sum(kinds.values()), mean_reward=mean_reward(kinds)[1],
                                 outcomes={k: kinds[k] for k in OUTCOME_KINDS if kinds.get(k)})
                 for name, kinds in sorted(by_harness.items())]
    diagnosis = state.diagnosis
    return RolloutsPanel(status=state.manifest.status, current_stage=diagnosis.current_stage,
                         last_progress_at=diagnosis.last_progress_at,
                         minutes_since_progress=diagnosis.minutes_since_progress, concurrency=concurrency,
                         stages=stages, harnesses=harnesses, live=diagnosis.live, findings=diagnosis.findings)


# ---------------------------------------------------------------------------------------------- fidelity


class FidelityRow(BaseModel):
    label: str
    iteration: int
    live: bool
    pearson: float | None = None  # train/inference log-prob correlation of the train step on these rollouts
    kl: float | None = None
    abs_diff_mean: float | None = None
    abs_diff_max: float | None = None
    routing_differs_share: float | None = None
    tokens: int = 0
    routed_tokens: int = 0  # tokens whose routed experts the engine recorded (R3 replays them)
    segments: dict[str, int] = Field(default_factory=dict)  # reason (start, rewrite, subagent) -> segments
    subagent_segments: int = 0
    calls: dict[str, int] = Field(default_factory=dict)  # kind (start, extend, rewrite, subagent) -> LLM calls
    failed_calls: int = 0

    @property
    def routing_coverage(self) -> float | None:
        return self.routed_tokens / self.tokens if self.tokens else None

    @property
    def rewrites(self) -> int:
        return self.calls.get("rewrite", 0)

    @property
    def subagent_calls(self) -> int:
        return self.calls.get("subagent", 0)


class FidelityPanel(BaseModel):
    rows: list[FidelityRow]
    steps: list[StepPoint]
    pearson_min: float = PEARSON_MIN


def fidelity(state: RunState) -> FidelityPanel:
    ids = state.ids("rollout")
    with state.catalog() as catalog:
        segments = queries.segment_counts(catalog, ids)
        calls = queries.call_counts(catalog, ids)
        steps = _steps(state, catalog)
    rows = []
    for run in state.runs:
        if run.purpose != "rollout":
            continue
        row = FidelityRow(label=run.label, iteration=run.iteration, live=run.live)
        train = state.manifest.stages.get(f"train/{run.iteration}")
        if train is not None:
            for name, metric in FIDELITY_METRICS.items():
                setattr(row, name, _number(train.metrics.get(metric)))
        for item in segments:
            if (item["run_id"], item["stage"], int(item["iteration"])) == (run.data_run_id, run.stage, run.iteration):
                row.segments[item["reason"]] = int(item["segments"])
                row.subagent_segments += int(item["subagent_segments"])
                row.tokens += int(item["tokens"])
                row.routed_tokens += int(item["routed_tokens"])
        for item in calls:
            if (item["run_id"], item["stage"], int(item["iteration"])) == (run.data_run_id, run.stage, run.iteration):
                row.calls[item["kind"]] = int(item["calls"])
                row.failed_calls += int(item["failed"])
        rows.append(row)
    return FidelityPanel(rows=rows, steps=steps)


# ---------------------------------------------------------------------------------------------- task grid


class TaskCell(BaseModel):
    attempts: int
    graded: int
    resolved: int
    infra_errors: int

    @property
    def rate(self) -> float | None:
        return self.resolved / self.graded if self.graded else None


class TaskRow(BaseModel):
    task_id: str
    cells: dict[str, TaskCell]  # column label -> cell


class TaskGrid(BaseModel):
    columns: list[str]  # the run's data runs in order: rollout iterations, evaluations ...
    rows: list[TaskRow]


def task_grid(state: RunState) -> TaskGrid:
    runs = [run for run in state.runs if run.purpose in ("rollout", "evaluation", "filter")]
    by_key = {(run.data_run_id, run.stage, run.iteration): run.label for run in runs}
    with state.catalog() as catalog:
        rows = queries.task_pass_rates(catalog, sorted({run.data_run_id for run in runs}))
    tasks: dict[str, dict[str, TaskCell]] = defaultdict(dict)
    for row in rows:
        label = by_key.get((row["run_id"], row["stage"], int(row["iteration"])))
        if label is not None:
            tasks[row["task_id"]][label] = TaskCell(attempts=int(row["attempts"]), graded=int(row["graded"]),
                                                    resolved=int(row["resolved"]),
                                                    infra_errors=int(row["infra_errors"]))
    return TaskGrid(columns=[run.label for run in runs],
                    rows=[TaskRow(task_id=task, cells=cells) for task, cells in sorted(tasks.items())])


# ---------------------------------------------------------------------------------------------- logs


Level = Literal["info", "warning", "error"]
LEVELS: dict[Level, int] = {"info": 0, "warning": 1, "error": 2}
FAILED_TERMINATIONS = {"harness_failed", "env_setup_failed"}  # infrastructure: the rollout is retried


class LogEvent(BaseModel):
    at: str
    level: Level
    source: str  # run, a stage label, a data run's label
    text: str


class LogsPanel(BaseModel):
    events: list[LogEvent]  # newest first
    limit: int = LOG_ROLLOUTS


def logs(state: RunState, min_level: Level = "info") -> LogsPanel:
    """The run's events, newest first: its start and end, each stage recorded (with its main numbers), each rollout
    stored (termination, error) and each grading (outcome, cheat rules), and the diagnosis's findings."""
    manifest = state.manifest
    events = [LogEvent(at=manifest.created_at, level="info", source="run",
                       text=f"run {manifest.run_id} started: harness {state.settings.harness.name}, model "
                            f"{state.settings.model.name}, {state.settings.pipeline.iterations} iterations")]
    for label, result in manifest.stages.items():
        summary = _short(result.metrics, STAGE_SUMMARY.get(result.stage, ()))
        state_text = "served from cache" if result.cached else f"done in {result.seconds:.1f}s"
        events.append(LogEvent(at=result.created_at, level="info", source=label,
                               text=f"{label} {state_text}" + (f": {summary}" if summary else "")))
    labels = {(run.data_run_id, run.stage, run.iteration): run.label for run in state.runs}
    with state.catalog() as catalog:
        stored = queries.rollout_index(catalog, state.ids(), LOG_ROLLOUTS)
        graded = queries.outcome_events(catalog, state.ids(), LOG_ROLLOUTS)
    for row in stored:
        source = labels.get((row["run_id"], row["stage"], int(row["iteration"])), row["run_id"])
        termination = row.get("termination") or "?"
        level: Level = "error" if row.get("error") or termination in FAILED_TERMINATIONS else "info"
        text = (f"rollout {row['rollout_id']} ({row['task_id']} #{row['sample_index']}) stored: {termination}, "
                f"{row.get('num_turns') or 0} turns, {row.get('num_tokens') or 0} tokens")
        if row.get("error"):
            text += f"; error: {row['error']}"
        events.append(LogEvent(at=_iso(row["written_at"]) or "", level=level, source=source, text=text))
    by_run = {run.data_run_id: run.label for run in state.runs}
    for row in graded:
        kind = row["kind"]
        level = "warning" if kind in ("cheat", "infra_error") else "info"
        text = f"rollout {row['rollout_id']} graded {kind}"
        if row.get("cheat_rules"):
            text += f" (rules: {', '.join(row['cheat_rules'])})"
        if (row.get("attempts") or 1) > 1:
            text += f" after {row['attempts']} attempts"
        events.append(LogEvent(at=_iso(row["written_at"]) or "", level=level,
                               source=f"{by_run.get(row['run_id'], row['run_id'])} grading", text=text))
    if manifest.status != "running":
        ended = max((r.created_at for r in manifest.stages.values()), default=manifest.created_at)
        error = manifest.summary.get("error")
        events.append(LogEvent(at=ended, level="error" if manifest.status == "failed" else "info", source="run",
                               text=f"run {manifest.status}" + (f": {error}" if error else "")))
    for finding in state.diagnosis.findings:
        events.append(LogEvent(at=state.diagnosis.checked_at, level=finding.severity, source="lego status",
                               text=f"{finding.signature} ({finding.area}): {finding.summary}"))
    shown = [event for event in events if LEVELS[event.level] >= LEVELS[min_level]]
    shown.sort(key=lambda event: _parse_time(event.at) or datetime.min.replace(tzinfo=UTC), reverse=True)
    return LogsPanel(events=shown)


# ---------------------------------------------------------------------------------------------- harness comparison


class EvaluationRow(BaseModel):
    run_id: str  # the pipeline run
    label: str
    split: str | None
    harness: str
    policy_version: int | None
    attempts: int
    resolved: int
    rate: float | None
    low: float | None
    high: float | None
    cheat: int
    infra_error: int


class HarnessRollouts(BaseModel):
    run_id: str
    harness: str
    rollouts: int
    graded: int
    resolved: int
    mean_reward: float | None
    mean_turns: float | None
    mean_tokens: float | None


class HarnessPanel(BaseModel):
    runs: list[str]
    evaluations: list[EvaluationRow]
    rollouts: list[HarnessRollouts]
    unreadable: list[str] = Field(default_factory=list)  # runs whose manifest could not be read, with why


def harnesses(work: WorkDir, config: LegoConfig, run_ids: list[str]) -> HarnessPanel:
    """The runs side by side, per harness: each evaluation's resolved rate (with its Wilson interval, from the
    catalog's eval_summary view) and the RL rollouts' outcomes."""
    runs: list[tuple[RunManifest, list[DataRun]]] = []
    unreadable = []
    for run_id in run_ids[:HARNESS_RUNS]:
        try:
            manifest = load_manifest(work, run_id)
        except (LegoError, OSError, ValueError) as exc:  # a run removed, a manifest damaged
            unreadable.append(f"{run_id}: {exc}")
            continue
        runs.append((manifest, data_runs(manifest, [])))
    everything = sorted({run.data_run_id for _, found in runs for run in found})
    with Catalog.open(work, config, in_memory=True) as catalog:
        summaries = queries.eval_summaries(catalog, everything)
        counts = queries.outcome_counts(catalog, everything)
    evaluations = []
    rollout_rows = []
    for manifest, found in runs:
        for run in found:
            if run.purpose == "evaluation":
                for row in summaries:
                    if row["run_id"] == run.data_run_id:
                        evaluations.append(EvaluationRow(
                            run_id=manifest.run_id, label=run.label, split=run.split, harness=row["harness"] or "?",
                            policy_version=row["policy_version"], attempts=int(row["attempts"]),
                            resolved=int(row["resolved"]), rate=_number(row["resolved_rate"]),
                            low=_number(row["resolved_low"]), high=_number(row["resolved_high"]),
                            cheat=int(row["cheat"]), infra_error=int(row["infra_error"])))
        ids = {run.data_run_id for run in found if run.purpose == "rollout"}
        per_harness: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for row in counts:
            if row["run_id"] in ids:
                per_harness[row["harness"] or "?"].append(row)
        for name, group in sorted(per_harness.items()):
            kinds: dict[str, int] = defaultdict(int)
            for row in group:
                kinds[row["kind"]] += int(row["rollouts"])
            total = sum(kinds.values())
            graded, mean = mean_reward(kinds)
            rollout_rows.append(HarnessRollouts(
                run_id=manifest.run_id, harness=name, rollouts=total, graded=graded, resolved=kinds.get("resolved", 0),
                mean_reward=mean, mean_turns=sum(int(r["turns"]) for r in group) / total if total else None,
                mean_tokens=sum(int(r["tokens"]) for r in group) / total if total else None))
    return HarnessPanel(runs=[manifest.run_id for manifest, _ in runs], evaluations=evaluations,
                        rollouts=rollout_rows, unreadable=unreadable)
