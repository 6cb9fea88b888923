"""`lego status`: a diagnosis of a live or finished pipeline run, from its manifest and the data it stored.

Each check is a named signature that points at one part of the system, so that a user can tell the policy's
trouble from the environment's:

- `logprob_mismatch` (trainer): the train/inference log-prob Pearson of a train step is below PEARSON_MIN.
- `infra_errors_rising` (environment): the verify stages' infra-error rate rises (rule in `_rising`).
- `zero_variance_groups` (policy): too few GRPO groups have reward variance; the train step has no signal.
- `tool_call_collapse` (policy): most rollouts never call a tool (replies without tool calls).
- `learning_rate_zero` (trainer): a train step's optimizer stepped with learning rate 0.
- `eval_coverage_short` (environment): an evaluation graded fewer attempts than planned, or one is missing.
- `stage_stalled` (pipeline): a running run made no progress for `stall_minutes`.
- `rewards_all_zero` (policy): every graded rollout of an iteration got reward 0.
- `cheat_rate_rising` (policy): the verify stages' cheat rate rises (rule in `_rising`).
- `run_failed` (pipeline): the run ended with an error.

Each finding carries its evidence (numbers per iteration, rollout ids) and what to check. Nothing here writes:
the catalog is opened in memory (a live run may hold the catalog file), and the manifest is only read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow.parquet as pq
from pydantic import BaseModel, Field, ValidationError

from lego.config import LegoConfig
from lego.data.catalog import Catalog
from lego.data.reader import iter_segment_batches
from lego.data.schema import SCHEMA_DIR_PARTS
from lego.pipeline.artifacts import StageResult
from lego.pipeline.learning import learning_curve
from lego.pipeline.manifest import RunManifest, load_manifest, manifest_path
from lego.workdir import WorkDir

PEARSON_MIN = 0.99  # train/inference log-prob correlation below this: the trainer does not score what was sampled
INFRA_ERROR_FLOOR = 0.05  # a rising infra-error rate counts from this rate on
INFRA_ERROR_HIGH = 0.25  # an infra-error rate this high counts whatever the trend
CHEAT_RATE_FLOOR = 0.05
CHEAT_RATE_HIGH = 0.25
SIGNAL_SHARE_MIN = 0.25  # share of GRPO groups (in the loss) whose rewards differ
NO_TOOL_CALL_SHARE = 0.5  # share of rollouts none of whose replies calls a tool
LIVE_MIN_ROLLOUTS = 4  # a rollout stage in progress is judged once it stored this many rollouts
EVAL_COVERAGE_MIN = 0.9  # graded attempts of an evaluation over its planned attempts (tasks x samples)
STALL_MINUTES = 15.0
MAX_IDS = 10  # rollout ids listed as evidence per finding

# Qwen3's `<tool_call>` and `<|im_start|>` are single added tokens (tokenizer.json's added_tokens); Qwen3 is the
# only tokenizer lego serves (model.tokenizer), and lego/proxy/reply.py reads a reply's tool calls from that tag.
TOOL_CALL_TOKEN = 151657
TURN_START_TOKEN = 151644

Severity = Literal["error", "warning"]
Area = Literal["policy", "environment", "trainer", "pipeline"]


class Finding(BaseModel):
    signature: str
    severity: Severity
    area: Area  # whose trouble it is: the policy's, the environment's (sandboxes, harness, grader), the trainer's
    summary: str
    evidence: dict[str, Any] = Field(default_factory=dict)
    what_to_check: list[str] = Field(default_factory=list)


class LiveStage(BaseModel):
    """Rollouts a stage in progress stored so far (it has no result in the manifest yet)."""

    data_run_id: str
    stage: str
    iteration: int
    rollouts: int
    outcomes: dict[str, int] = Field(default_factory=dict)
    last_write: str


class Diagnosis(BaseModel):
    run_id: str
    status: str
    created_at: str
    checked_at: str
    stages_done: list[str] = Field(default_factory=list)
    current_stage: str | None = None  # the next scheduled stage without a result, while the run is running
    stages_left: list[str] = Field(default_factory=list)
    last_progress_at: str | None = None
    last_progress_source: str | None = None
    minutes_since_progress: float | None = None
    live: list[LiveStage] = Field(default_factory=list)
    curve: list[dict[str, Any]] = Field(default_factory=list)  # lego.pipeline.learning's, one entry per policy
    findings: list[Finding] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return not self.findings

    @property
    def has_errors(self) -> bool:
        return any(finding.severity == "error" for finding in self.findings)


# ---------------------------------------------------------------------------------------------- the run's shape


def _parse_time(value: str) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat()


def run_config(manifest: RunManifest, fallback: LegoConfig) -> tuple[LegoConfig, str | None]:
    """The config the run recorded (what its stages used); the given one when the record no longer validates."""
    if not manifest.config:
        return fallback, "the manifest records no config; the current config's settings were used"
    try:
        return LegoConfig.model_validate(manifest.config), None
    except ValidationError as exc:
        return fallback, (f"the manifest's config no longer validates ({exc.error_count()} errors); the current "
                          "config's settings were used")


def scheduled_stages(config: LegoConfig) -> list[str]:
    """The stage labels a run of `config` records, in order (flows/pipeline.py's run_stages)."""
    labels = ["taskset"]
    if config.warmstart.enabled:
        labels.append("warmstart")
    if config.filter.enabled:
        labels.append("filter")
    if config.eval.at_start:
        labels.append("baseline")
    last = config.pipeline.iterations - 1
    for iteration in range(config.pipeline.iterations):
        sampled = ("rollout", "verify", "dataset") if config.train.trains_on_rollouts else ()
        labels += [f"{stage}/{iteration}" for stage in (*sampled, "train")]
        if (iteration + 1) % config.eval.every == 0 or iteration == last:
            labels.append(f"evaluate/{iteration}")
    return labels


def _by_iteration(manifest: RunManifest, stage: str) -> list[StageResult]:
    return sorted((r for r in manifest.stages.values() if r.stage == stage and r.iteration is not None),
                  key=lambda r: r.iteration)


def _number(value: Any) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def _first(metrics: dict[str, float], *names: str) -> float | None:
    for name in names:
        if (value := _number(metrics.get(name))) is not None:
            return value
    return None


def _trained(result: StageResult) -> bool:
    metrics = result.metrics
    return bool(metrics.get("trained", 0) or metrics.get("optimizer_steps", 0))


# ---------------------------------------------------------------------------------------------- progress


@dataclass
class _DataDir:
    data_run_id: str
    stage: str
    iteration: int
    mtime: float


def _data_dirs_since(work: WorkDir, since: float) -> list[_DataDir]:
    """Data directories (<data>/<data run>/<stage>/iter=<n>) that changed at or after `since`, newest first."""
    found = []
    seed = work.data.joinpath(*SCHEMA_DIR_PARTS)
    for directory in work.data.glob("*/*/iter=*"):
        if directory == seed or not directory.is_dir():
            continue
        mtime = directory.stat().st_mtime
        try:
            iteration = int(directory.name.removeprefix("iter="))
        except ValueError:
            continue
        if mtime >= since:
            found.append(_DataDir(directory.parent.parent.name, directory.parent.name, iteration, mtime))
    return sorted(found, key=lambda d: d.mtime, reverse=True)


def last_progress(work: WorkDir, manifest: RunManifest) -> tuple[float, str]:
    """When the run last moved, and what moved, as (unix time, description).

    Progress is the newest of: the manifest's last write (a stage recorded its result), a data directory's last
    change (each rollout, outcome or train step is a new file renamed into its directory, which updates the
    directory's mtime: lego/data/writer.py) and an artifact directory's last change (a stage writing its
    outputs). Only changes at or after the run's start count. Directory mtimes, not the rows' `written_at`, so
    that a status check stats directories instead of reading every Parquet file; a second run writing into the
    same work dir at the same time would count as this run's progress too.
    """
    path = manifest_path(work, manifest.run_id)
    best = (path.stat().st_mtime, "manifest written (the run started or recorded a stage)") if path.is_file() else (0.0, "")
    started = _parse_time(manifest.created_at)
    since = started.timestamp() if started else best[0]
    for directory in _data_dirs_since(work, since)[:1]:
        if directory.mtime > best[0]:
            best = (directory.mtime, f"data {directory.data_run_id}/{directory.stage}/iter={directory.iteration}")
    for directory in work.artifacts.glob("*/*"):
        if directory.is_dir() and (mtime := directory.stat().st_mtime) >= since and mtime > best[0]:
            best = (mtime, f"artifact {directory.parent.name}/{directory.name}")
    return best


def _recorded_at(manifest: RunManifest) -> float:
    """When the run's newest stage result was recorded (the run's start when none was)."""
    times = [t.timestamp() for r in manifest.stages.values() if not r.cached and (t := _parse_time(r.created_at))]
    started = _parse_time(manifest.created_at)
    return max(times, default=started.timestamp() if started else 0.0)


def live_stages(work: WorkDir, manifest: RunManifest, catalog: Catalog) -> list[LiveStage]:
    """What the stage in progress stored so far: the rollouts of each data directory changed since the newest
    recorded stage, with their outcomes. A changed outcome directory (a grading in progress: `verify-<key>`,
    `<stage>-verify`, lego/pipeline/grading.py) stands for the rollouts it grades."""
    seen: dict[tuple[str, str, int], float] = {}
    for directory in _data_dirs_since(work, _recorded_at(manifest)):
        stage = directory.stage
        if stage.endswith("-verify"):
            stage = stage.removesuffix("-verify")
        elif stage.startswith("verify-"):
            stage = "rollout"
        key = (directory.data_run_id, stage, directory.iteration)
        seen[key] = max(seen.get(key, 0.0), directory.mtime)
    out = []
    for (data_run_id, stage, iteration), mtime in seen.items():
        rollouts = catalog.one("SELECT count(*) FROM rollouts WHERE run_id = ? AND stage = ? AND iteration = ?",
                               [data_run_id, stage, iteration])
        if not rollouts or not rollouts[0]:
            continue  # train steps, tasks: no rollouts
        kinds = catalog.rows(
            "SELECT o.kind, count(*) AS n FROM latest_outcomes AS o JOIN rollouts AS r "
            "ON r.run_id = o.run_id AND r.rollout_id = o.rollout_id "
            "WHERE r.run_id = ? AND r.stage = ? AND r.iteration = ? GROUP BY o.kind ORDER BY o.kind",
            [data_run_id, stage, iteration])
        out.append(LiveStage(data_run_id=data_run_id, stage=stage, iteration=iteration, rollouts=int(rollouts[0]),
                             outcomes={row["kind"]: int(row["n"]) for row in kinds}, last_write=_iso(mtime)))
    return out


# ---------------------------------------------------------------------------------------------- tool calls


@dataclass
class ToolUse:
    """Replies and tool calls of one rollout stage iteration."""

    rollouts: int = 0  # rollouts with at least one reply
    replies: int = 0
    replies_without_call: int = 0
    rollouts_without_call: list[str] = field(default_factory=list)

    @property
    def share_without_call(self) -> float:
        return len(self.rollouts_without_call) / self.rollouts if self.rollouts else 0.0


def reply_tool_calls(token_ids: np.ndarray, response_mask: np.ndarray) -> list[bool]:
    """Per reply of a segment (a maximal run of sampled tokens), whether it calls a tool: a `<tool_call>` among
    its sampled tokens, or in its own turn's prompt part (from the turn's `<|im_start|>` on): records from proxies
    that wrote a forced call's opening into the prompt (the proxy now samples it, lego/engine/constraints.py)."""
    mask = np.asarray(response_mask, dtype=np.int8)
    if not mask.any():
        return []
    tokens = np.asarray(token_ids)
    edges = np.diff(np.concatenate(([0], mask, [0])))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    calls = []
    previous_end = 0
    for start, end in zip(starts, ends, strict=True):
        prompt = tokens[previous_end:start]
        turn = np.flatnonzero(prompt == TURN_START_TOKEN)
        opening = prompt[turn[-1]:] if len(turn) else prompt
        calls.append(bool((tokens[start:end] == TOOL_CALL_TOKEN).any() or (opening == TOOL_CALL_TOKEN).any()))
        previous_end = end
    return calls


def tool_use(catalog: Catalog, data_run_id: str, stage: str, iteration: int) -> ToolUse:
    """Reads only the token ids and masks of the iteration's segments, streamed."""
    stored = {row["rollout_id"] for row in catalog.rows(
        "SELECT rollout_id FROM rollouts WHERE run_id = ? AND stage = ? AND iteration = ?",
        [data_run_id, stage, iteration])}
    replies: dict[str, list[bool]] = {}
    for batch in iter_segment_batches(catalog, data_run_id, stage, iteration,
                                      columns=["rollout_id", "token_ids", "response_mask"]):
        ids = batch.column("rollout_id").to_pylist()
        tokens, masks = batch.column("token_ids"), batch.column("response_mask")
        for index, rollout_id in enumerate(ids):
            if rollout_id not in stored:  # a batch whose rollouts file is not written yet (lego/data/writer.py)
                continue
            replies.setdefault(rollout_id, []).extend(
                reply_tool_calls(tokens[index].values.to_numpy(zero_copy_only=False),
                                 masks[index].values.to_numpy(zero_copy_only=False)))
    use = ToolUse()
    for rollout_id in sorted(replies):
        calls = replies[rollout_id]
        if not calls:
            continue
        use.rollouts += 1
        use.replies += len(calls)
        use.replies_without_call += calls.count(False)
        if not any(calls):
            use.rollouts_without_call.append(rollout_id)
    return use


# ---------------------------------------------------------------------------------------------- checks


def _rising(series: list[tuple[int, float]], floor: float, high: float) -> bool:
    """Rising: the latest iteration's rate is at least `floor` and above the first iteration's (with a single
    iteration, above zero); or it is at least `high`, whatever the trend."""
    if not series:
        return False
    latest = series[-1][1]
    first = series[0][1] if len(series) > 1 else 0.0
    return latest >= high or (latest >= floor and latest > first)


def _outcome_ids(catalog: Catalog, data_run_id: str, stage: str | None, iteration: int | None,
                 kind: str) -> list[dict[str, Any]]:
    query = ("SELECT o.rollout_id, o.cheat_rules, o.evidence_json, r.termination, r.error FROM latest_outcomes AS o "
             "LEFT JOIN rollouts AS r ON r.run_id = o.run_id AND r.rollout_id = o.rollout_id "
             "WHERE o.run_id = ? AND o.kind = ?")
    params: list[Any] = [data_run_id, kind]
    if stage is not None:
        query += " AND o.stage = ?"
        params.append(stage)
    if iteration is not None:
        query += " AND o.iteration = ?"
        params.append(iteration)
    return catalog.rows(query + " ORDER BY o.rollout_id", params)


def _evidence(text: str | None) -> str | None:
    """A grader's evidence JSON, or None when it says nothing."""
    return text if text and text.strip() not in ("{}", "null", "[]") else None


def _short(text: str | None, limit: int = 200) -> str | None:
    return None if text is None else (text if len(text) <= limit else text[:limit] + "...")


class _Checks:
    def __init__(self, work: WorkDir, manifest: RunManifest, config: LegoConfig, catalog: Catalog):
        self.work = work
        self.manifest = manifest
        self.config = config
        self.catalog = catalog
        self.findings: list[Finding] = []

    def add(self, signature: str, severity: Severity, area: Area, summary: str, evidence: dict[str, Any],
            what_to_check: list[str]) -> None:
        self.findings.append(Finding(signature=signature, severity=severity, area=area, summary=summary,
                                     evidence=evidence, what_to_check=what_to_check))

    # -------------------------------------------------------------------------------- trainer
    def logprob_mismatch(self) -> None:
        series = []
        for result in _by_iteration(self.manifest, "train"):
            pearson = _first(result.metrics, "logprob_pearson", "pearson")
            if _trained(result) and pearson is not None:
                series.append((result.iteration, pearson, result.metrics))
        low = [(iteration, value) for iteration, value, _ in series if value < PEARSON_MIN]
        if not low:
            return
        train, engine = self.config.train, self.config.engine
        latest = series[-1][2]
        evidence = {"pearson_by_iteration": {i: round(v, 6) for i, v, _ in series},
                    "iterations_below": [i for i, _ in low], "threshold": PEARSON_MIN,
                    "logprob_abs_diff_mean": _number(latest.get("logprob_abs_diff_mean")),
                    "logprob_abs_diff_max": _number(latest.get("logprob_abs_diff_max")),
                    "routing_differs_share": _number(latest.get("routing_differs_share")),
                    "router_replay": train.router_replay, "train_dtype": train.dtype, "engine_dtype": engine.dtype,
                    "engine_kind": engine.kind}
        checks = []
        if train.router_replay != "R3":
            checks.append(f"train.router_replay is {train.router_replay!r}: turn R3 on so the trainer replays the "
                          "experts the engine routed to")
        else:
            checks.append("R3 alignment: every segment carries its routed experts and the trainer replays them "
                          "(routing_differs_share is the share of tokens whose experts differ without replay)")
        if train.dtype != engine.dtype:
            checks.append(f"dtype drift: the engine samples in {engine.dtype} and the trainer scores in "
                          f"{train.dtype}; use one dtype (train.dtype / engine.dtype)")
        else:
            checks.append("dtype drift: the engine's and the trainer's kernels (attention implementation, "
                          "fp32 log-softmax) and that both load the same checkpoint (policy_version)")
        checks.append("the proxy's token stream: a re-tokenized history makes the trainer score tokens the engine "
                      "never sampled")
        first = low[0]
        self.add("logprob_mismatch", "error", "trainer",
                 f"train/inference log-prob Pearson {first[1]:.4f} at iteration {first[0]}, below {PEARSON_MIN} "
                 f"({len(low)} of {len(series)} trained iterations)", evidence, checks)

    def learning_rate_zero(self) -> None:
        """From the rate the optimizer stepped with (the train step's `learning_rate`); train.lr itself must be > 0
        to validate, so a zero comes from a schedule (a warm-up from 0, a decay to 0) or a trainer that ignores it."""
        rates = {}
        for result in _by_iteration(self.manifest, "train"):
            rate = _first(result.metrics, "learning_rate", "lr")
            if rate is not None and _trained(result):
                rates[result.iteration] = rate
        at_zero = [iteration for iteration, rate in rates.items() if rate == 0]
        if not at_zero:
            return
        self.add("learning_rate_zero", "error", "trainer",
                 f"the optimizer stepped with learning rate 0 at iteration(s) {at_zero}: those train steps did not "
                 "move the policy",
                 {"lr_by_iteration": rates, "iterations_at_zero": at_zero, "train_lr_configured": self.config.train.lr},
                 ["a learning-rate schedule that starts at 0 (warm-up) or has decayed to 0",
                  "train.lr in the run's config and its overrides, and that the trainer's optimizer uses it"])

    # -------------------------------------------------------------------------------- environment
    def infra_errors_rising(self) -> None:
        verifies = _by_iteration(self.manifest, "verify")
        series = [(r.iteration, v) for r in verifies if (v := _number(r.metrics.get("infra_error_rate"))) is not None]
        if not _rising(series, INFRA_ERROR_FLOOR, INFRA_ERROR_HIGH):
            return
        latest = verifies[-1]
        rows = _outcome_ids(self.catalog, latest.data.get("data_run_id", ""), latest.data.get("outcome_stage"),
                            latest.iteration, "infra_error")
        errors = sorted({e for row in rows if (e := _short(row.get("error") or _evidence(row.get("evidence_json"))))})
        terminations: dict[str, int] = {}
        for row in rows:
            terminations[str(row.get("termination"))] = terminations.get(str(row.get("termination")), 0) + 1
        evidence = {"infra_error_rate_by_iteration": {i: round(v, 4) for i, v in series},
                    "floor": INFRA_ERROR_FLOOR, "high": INFRA_ERROR_HIGH,
                    "infra_errors": int(latest.metrics.get("outcome.infra_error", len(rows))),
                    "outcomes": int(latest.metrics.get("outcomes", 0)),
                    "rollout_ids": [row["rollout_id"] for row in rows[:MAX_IDS]],
                    "terminations": terminations, "errors": errors[:3]}
        first = series[0][1] if len(series) > 1 else 0.0
        self.add("infra_errors_rising", "error" if series[-1][1] >= INFRA_ERROR_HIGH else "warning", "environment",
                 f"infra-error rate {series[-1][1]:.1%} at iteration {series[-1][0]} (first iteration: {first:.1%}); "
                 "these rollouts are dropped from the loss", evidence,
                 ["the Docker engine (lego doctor; disk space, pids and memory limits of sandbox.*)",
                  "the harness install and start in the sandbox (the errors above; `lego data show`)",
                  "the policy engine behind the proxy (engine errors end a rollout as harness_failed)",
                  "the grader's sandbox (verify.timeout_s, verify.infra_retries)"])

    def eval_coverage_short(self) -> None:
        taskset = self.manifest.stages.get("taskset")
        short = []
        ids: list[str] = []
        for label, result in self.manifest.stages.items():
            if result.stage not in ("baseline", "evaluate"):
                continue
            for split, prefix, task_metric, data_key in (("eval", "", "eval_tasks", "data_run_id"),
                                                         ("train", "train.", "train_tasks", "data_run_id_train")):
                graded = _number(result.metrics.get(f"{prefix}attempts"))
                if graded is None:
                    continue
                tasks = _number(taskset.metrics.get(task_metric)) if taskset is not None else None
                tasks = tasks if tasks is not None else _number(result.metrics.get(f"{prefix}tasks")) or 0.0
                planned = tasks * self.config.eval.samples_for(split)
                if planned and graded < EVAL_COVERAGE_MIN * planned:
                    infra = _outcome_ids(self.catalog, result.data.get(data_key, ""), None, None, "infra_error")
                    ids += [row["rollout_id"] for row in infra]
                    short.append({"evaluation": label, "split": split, "graded": int(graded),
                                  "planned": int(planned), "coverage": round(graded / planned, 4),
                                  "tasks_covered": int(result.metrics.get(f"{prefix}tasks", 0)),
                                  "tasks_planned": int(tasks),
                                  "infra_errors": int(result.metrics.get(f"{prefix}infra_errors", 0))})
        missing = []
        # A `lego stage` run (from_run set) reruns one stage on another run's results: it schedules nothing else.
        if self.manifest.status == "completed" and self.manifest.from_run is None:
            missing = [label for label in scheduled_stages(self.config)
                       if label.split("/")[0] in ("baseline", "evaluate") and label not in self.manifest.stages]
        if not short and not missing:
            return
        parts = [f"{s['evaluation']} ({s['split']} split) graded {s['graded']} of {s['planned']} planned attempts"
                 for s in short]
        if missing:
            parts.append(f"scheduled evaluation(s) missing: {', '.join(missing)}")
        self.add("eval_coverage_short", "warning", "environment",
                 "; ".join(parts) + ": the resolved rates rest on fewer attempts than planned",
                 {"short": short, "missing": missing, "threshold": EVAL_COVERAGE_MIN,
                  "samples_per_task": {split: self.config.eval.samples_for(split) for split in ("eval", "train")},
                  "rollout_ids": ids[:MAX_IDS]},
                 ["the infra errors of the evaluation's rollouts (rollout_ids; `lego data show`)",
                  "tasks whose environment fails to build (`lego tasks validate`)",
                  "eval.samples_per_task (eval.samples_per_split) and eval.limit against the split's size",
                  "a missing evaluation: eval.every and eval.at_start, or a stage that was not rerun"])

    # -------------------------------------------------------------------------------- policy
    def zero_variance_groups(self) -> None:
        series = []
        low = []
        for result in _by_iteration(self.manifest, "dataset"):
            in_loss = int(result.metrics.get("groups_in_loss", 0))
            signal = int(result.metrics.get("groups_with_signal", 0))
            if self.config.train.adv_estimator == "success_mass":
                # its signal is a success, not a difference: an all-solved group is raised too
                signal += sum(1 for group in self._flat_groups(result) if group["reward"] and group["reward"] > 0)
            series.append((result.iteration, in_loss, signal, result))
            if (in_loss and signal / in_loss < SIGNAL_SHARE_MIN) or (not in_loss and result.metrics.get("rollouts")):
                low.append((result.iteration, in_loss, signal, result))
        if not low:
            return
        iteration, in_loss, signal, result = low[-1]
        flat = self._flat_groups(result)
        excluded = {name.removeprefix("excluded."): int(value) for name, value in result.metrics.items()
                    if name.startswith("excluded.") and value}
        evidence = {"groups_by_iteration": {i: {"in_loss": n, "with_signal": s} for i, n, s, _ in series},
                    "iterations_low": [i for i, *_ in low], "threshold_share": SIGNAL_SHARE_MIN,
                    "flat_groups": flat[:MAX_IDS], "excluded": excluded}
        solved = sum(1 for group in flat if group["reward"] == 1.0)
        failed = sum(1 for group in flat if group["reward"] == 0.0)
        summary = (f"{signal} of {in_loss} GRPO groups have reward variance at iteration {iteration}"
                   if in_loss else f"no GRPO group is in the loss at iteration {iteration} (excluded: {excluded})")
        if flat:
            summary += f" ({solved} all solved, {failed} all failed)"
        self.add("zero_variance_groups", "error" if signal == 0 else "warning", "policy",
                 summary + ": no learning signal from the rest", evidence,
                 ["all-solved groups: tasks too easy for the policy (filter.enabled with filter.max_solved)",
                  "all-failed groups: tasks out of reach (the warm start, filter.min_solved, harness.max_turns)",
                  "rollout.samples_per_task (more samples make mixed groups likelier), sampling.temperature",
                  "excluded rollouts (infra errors, data.min_valid_per_group)"])

    def _flat_groups(self, result: StageResult) -> list[dict[str, Any]]:
        """The zero-variance groups of a dataset artifact: task, the reward all its samples got, rollout ids."""
        path = result.outputs.get("advantages")
        if not path or not Path(path).is_file():
            return []
        rows = pq.read_table(path).to_pylist()
        groups: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            if row.get("in_loss"):
                groups.setdefault(row["task_id"], []).append(row)
        return [{"task_id": task, "reward": members[0]["reward"],
                 "rollout_ids": [m["rollout_id"] for m in members]}
                for task, members in sorted(groups.items())
                if all(abs(m["advantage"] or 0.0) <= 1e-9 for m in members)]

    def rewards_all_zero(self) -> None:
        zero = []
        for result in _by_iteration(self.manifest, "verify"):
            graded = int(result.metrics.get("graded", 0))
            if graded and not result.metrics.get("outcome.resolved", 0):
                zero.append(result)
        if not zero:
            return
        latest = zero[-1]
        kinds = {name.removeprefix("outcome."): int(value) for name, value in latest.metrics.items()
                 if name.startswith("outcome.") and value}
        rows = self.catalog.rows(
            "SELECT rollout_id FROM latest_outcomes WHERE run_id = ? AND stage = ? AND iteration = ? "
            "AND reward IS NOT NULL ORDER BY rollout_id LIMIT ?",
            [latest.data.get("data_run_id", ""), latest.data.get("outcome_stage", ""), latest.iteration, MAX_IDS])
        self.add("rewards_all_zero", "error", "policy",
                 f"all {int(latest.metrics.get('graded', 0))} graded rollouts of iteration {latest.iteration} got "
                 f"reward 0 (outcomes: {kinds})",
                 {"iterations": [r.iteration for r in zero], "outcomes": kinds,
                  "rollout_ids": [row["rollout_id"] for row in rows]},
                 ["the grader: do the gold patches resolve the tasks (`lego tasks validate`)?",
                  "the policy: is any task in its reach (the warm start, the baseline evaluation, the filter stage)?",
                  "the budget: agent_timeout or overlong outcomes point at harness.max_turns, harness.timeout_s, "
                  "sampling.max_tokens and model.context_length",
                  "replies without tool calls (tool_call_collapse): an agent that never acts cannot resolve"])

    def cheat_rate_rising(self) -> None:
        verifies = _by_iteration(self.manifest, "verify")
        series = [(r.iteration, v) for r in verifies if (v := _number(r.metrics.get("cheat_rate"))) is not None]
        if not _rising(series, CHEAT_RATE_FLOOR, CHEAT_RATE_HIGH):
            return
        latest = verifies[-1]
        rows = _outcome_ids(self.catalog, latest.data.get("data_run_id", ""), latest.data.get("outcome_stage"),
                            latest.iteration, "cheat")
        rules: dict[str, int] = {}
        for row in rows:
            for rule in row.get("cheat_rules") or []:
                rules[rule] = rules.get(rule, 0) + 1
        first = series[0][1] if len(series) > 1 else 0.0
        self.add("cheat_rate_rising", "error" if series[-1][1] >= CHEAT_RATE_HIGH else "warning", "policy",
                 f"cheat rate {series[-1][1]:.1%} at iteration {series[-1][0]} (first iteration: {first:.1%}): the "
                 "policy is learning to game the grader",
                 {"cheat_rate_by_iteration": {i: round(v, 4) for i, v in series}, "floor": CHEAT_RATE_FLOOR,
                  "high": CHEAT_RATE_HIGH, "rules_fired": rules,
                  "rollout_ids": [row["rollout_id"] for row in rows[:MAX_IDS]]},
                 ["the rules that fired (rules_fired) and those rollouts' diffs",
                  "cheats get reward 0: a rising rate means the policy tries them anyway; check the tasks leak "
                  "nothing (hidden tests, git history) and the tamper checks hold"])

    def tool_call_collapse(self, live: list[LiveStage], current_stage: str | None) -> None:
        targets: list[tuple[str, str, int, str]] = []  # (data run, stage, iteration, label)
        rollouts = _by_iteration(self.manifest, "rollout")
        if rollouts:
            first, latest = rollouts[0], rollouts[-1]
            for result in ([first] if first is latest else [first, latest]):
                targets.append((result.data.get("data_run_id", ""), result.data.get("stage", "rollout"),
                                result.iteration, f"rollout/{result.iteration}"))
        if current_stage and current_stage.startswith("rollout/"):
            iteration = int(current_stage.split("/")[1])
            for stage in live:
                if stage.stage == "rollout" and stage.iteration == iteration and stage.rollouts >= LIVE_MIN_ROLLOUTS:
                    targets.append((stage.data_run_id, "rollout", iteration, f"{current_stage} (in progress)"))
                    break
        if not targets:
            return
        uses = [(label, tool_use(self.catalog, data_run_id, stage, iteration))
                for data_run_id, stage, iteration, label in targets]
        label, latest_use = uses[-1]
        if not latest_use.rollouts or latest_use.share_without_call < NO_TOOL_CALL_SHARE:
            return
        evidence = {"by_iteration": {name: {"rollouts": use.rollouts,
                                            "rollouts_without_tool_call": len(use.rollouts_without_call),
                                            "share": round(use.share_without_call, 4), "replies": use.replies,
                                            "replies_without_tool_call": use.replies_without_call}
                                     for name, use in uses},
                    "threshold_share": NO_TOOL_CALL_SHARE,
                    "rollout_ids": latest_use.rollouts_without_call[:MAX_IDS]}
        self.add("tool_call_collapse", "error", "policy",
                 f"{len(latest_use.rollouts_without_call)} of {latest_use.rollouts} rollouts of {label} never call "
                 f"a tool ({latest_use.replies_without_call} of {latest_use.replies} replies without a tool call)",
                 evidence,
                 ["read a few of these rollouts' replies: plain text where a `<tool_call>` block was due, or a "
                  "malformed block (invalid JSON stays in the text)",
                  "the tool-call format the chat template renders for this harness (lego/proxy/render.py)",
                  "whether RL rewarded short answers: rewards of rollouts without tool calls vs with them",
                  "sampling.temperature and the entropy of the last train steps (a collapsed policy)"])

    # -------------------------------------------------------------------------------- pipeline
    def stage_stalled(self, now: datetime, stall_minutes: float, progress: tuple[float, str],
                      current_stage: str | None) -> None:
        if self.manifest.status != "running" or not progress[0]:
            return
        minutes = (now.timestamp() - progress[0]) / 60
        if minutes < stall_minutes:
            return
        self.add("stage_stalled", "error", "pipeline",
                 f"no progress for {minutes:.0f} minutes (threshold {stall_minutes:g}) while {current_stage or 'the run'}"
                 " is in progress",
                 {"stage": current_stage, "last_progress_at": _iso(progress[0]), "last_progress": progress[1],
                  "minutes_since_progress": round(minutes, 1), "stall_minutes": stall_minutes},
                 ["whether the `lego run` process is alive (a killed run stays `running` in its manifest; "
                  "`lego run --resume RUN` continues it)",
                  "a hung sandbox or harness (docker ps on the run's engine; harness.timeout_s)",
                  "the policy engine (a stuck generation blocks every rollout)",
                  "a long train step writes nothing until it ends: raise --stall-minutes for a large model"])

    def run_failed(self) -> None:
        if self.manifest.status != "failed":
            return
        error = self.manifest.summary.get("error")
        self.add("run_failed", "error", "pipeline", f"the run failed: {_short(str(error), 300)}",
                 {"error": error, "stages_done": list(self.manifest.stages)},
                 ["the error above and the run's log", "`lego run --resume RUN` continues from the recorded stages"])


# ---------------------------------------------------------------------------------------------- entry point


def diagnose(work: WorkDir, config: LegoConfig, run_id: str = "latest", *, now: datetime | None = None,
             stall_minutes: float = STALL_MINUTES) -> Diagnosis:
    """Diagnose run `run_id` ('latest': the newest manifest of the work dir). `now`: the time to measure a stall
    against (the wall clock by default)."""
    manifest = load_manifest(work, run_id)
    now = now or datetime.now(UTC)
    settings, note = run_config(manifest, config)
    scheduled = scheduled_stages(settings)
    left = [label for label in scheduled if label not in manifest.stages]
    current = left[0] if manifest.status == "running" and left else None
    progress = last_progress(work, manifest)
    diagnosis = Diagnosis(run_id=manifest.run_id, status=manifest.status, created_at=manifest.created_at,
                          checked_at=now.isoformat(), stages_done=list(manifest.stages), current_stage=current,
                          stages_left=left if manifest.status == "running" else [],
                          notes=[note] if note else [])
    if progress[0]:
        diagnosis.last_progress_at = _iso(progress[0])
        diagnosis.last_progress_source = progress[1]
        diagnosis.minutes_since_progress = round((now.timestamp() - progress[0]) / 60, 1)
    diagnosis.curve = learning_curve(manifest, settings.eval.confidence)["curve"]
    with Catalog.open(work, settings, in_memory=True) as catalog:
        if manifest.status == "running":
            diagnosis.live = live_stages(work, manifest, catalog)
        checks = _Checks(work, manifest, settings, catalog)
        checks.run_failed()
        checks.stage_stalled(now, stall_minutes, progress, current)
        checks.logprob_mismatch()
        checks.learning_rate_zero()
        checks.infra_errors_rising()
        checks.eval_coverage_short()
        checks.zero_variance_groups()
        checks.rewards_all_zero()
        checks.cheat_rate_rising()
        checks.tool_call_collapse(diagnosis.live, current)
    order = {"error": 0, "warning": 1}
    diagnosis.findings = sorted(checks.findings, key=lambda f: order[f.severity])
    return diagnosis


def format_diagnosis(diagnosis: Diagnosis) -> str:
    """The human-readable report `lego status` prints."""
    lines = [f"run {diagnosis.run_id}: {diagnosis.status} (started {diagnosis.created_at})"]
    lines.append(f"stages done: {', '.join(diagnosis.stages_done) or 'none'}")
    if diagnosis.current_stage:
        lines.append(f"in progress: {diagnosis.current_stage} ({len(diagnosis.stages_left)} stages left)")
    if diagnosis.last_progress_at:
        lines.append(f"last progress: {diagnosis.last_progress_at} ({diagnosis.minutes_since_progress} min ago, "
                     f"{diagnosis.last_progress_source})")
    for stage in diagnosis.live:
        outcomes = ", ".join(f"{kind} {count}" for kind, count in stage.outcomes.items()) or "none graded yet"
        lines.append(f"live: {stage.data_run_id}/{stage.stage}/iter={stage.iteration}: {stage.rollouts} rollouts "
                     f"stored ({outcomes}), last at {stage.last_write}")
    for point in diagnosis.curve:
        rates = [f"{name} {rate['resolved']}/{rate['attempts']}" for name in ("train_split", "eval_split")
                 if (rate := point.get(name))]
        if rates:
            lines.append(f"policy {point['policy']}: " + ", ".join(rates))
    lines.extend(f"note: {note}" for note in diagnosis.notes)
    if diagnosis.healthy:
        lines.append("no problem found")
    for finding in diagnosis.findings:
        lines.append("")
        lines.append(f"[{finding.severity.upper()}] {finding.signature} ({finding.area}): {finding.summary}")
        for name, value in finding.evidence.items():
            if value not in (None, [], {}):
                lines.append(f"    {name}: {value}")
        for item in finding.what_to_check:
            lines.append(f"    check: {item}")
    return "\n".join(lines)
