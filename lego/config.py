"""Typed configuration: pydantic models loaded from configs/*.yaml plus key=value overrides.

A config file may name a `base:` file (relative to itself or to configs/) that it extends.
Every section is strict: an unknown key or a wrong type fails naming the key, the value
and what was expected.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from lego import CONFIGS_DIR
from lego.errors import ConfigError


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ProjectConfig(Section):
    name: str = "lego"
    work_dir: Path = Path(".lego")
    seed: int = 0


class DockerConfig(Section):
    # None: DOCKER_HOST, then the default socket, then (root on Linux) a private dockerd.
    host: str | None = None
    start_private_daemon: bool = True
    base_image_packages: list[str] = Field(
        default_factory=lambda: [
            "python3", "python3-pytest", "python3-venv", "git", "socat", "patch", "procps",
            "ca-certificates", "less", "tmux",
        ]
    )
    debian_suite: str = "bookworm"
    # How a sandbox harness reaches its proxy session: "mount" (the session socket's directory bind-mounted; the
    # engine must share this machine's file system), "tunnel" (over the engine's exec stream, for any engine:
    # lego/sandbox/tunnel.py), "auto" (mount for an engine on a local unix socket, the tunnel otherwise).
    proxy_channel: Literal["auto", "mount", "tunnel"] = "auto"
    # How a sandbox reads the worker's read-only directories (a harness install, the grading runner): "bind" (bind
    # mounts; the engine must share this machine's file system), "volume" (copied once per content into a volume on
    # the engine: lego/sandbox/content_volume.py), "auto" (bind for an engine on a local unix socket, else volume).
    files_channel: Literal["auto", "bind", "volume"] = "auto"


class CopyPretrainingSpec(Section):
    """Task-free copy pretraining after the random init (lego/engine/copy_pretraining.py): in-context copying,
    which a warm start needs to carry what a statement names into its fix and never teaches a random-init model."""

    enabled: bool = False
    short_steps: int = Field(3000, ge=1)  # the most steps of short rows; it stops once they are copied
    long_steps: int = Field(3000, ge=1)  # the most steps of growing rows; it stops once `max_length` rows are copied
    ramp_steps: int = Field(600, ge=1)  # long-phase steps over which the longest row grows to `max_length`
    max_length: int = Field(1600, ge=256)  # a harness prompt's length: where a fix reads its statement from
    # The share of copied tokens ranked first that ends each phase. A warm start from a model that copied 92% of
    # short repeats and 72% of long spans wrote no held-out fix; one from 96% and 83% wrote 13 of 32.
    short_target: float = Field(0.97, gt=0, le=1)
    long_target: float = Field(0.9, gt=0, le=1)
    short_lr: float = Field(3e-3, gt=0)
    long_lr: float = Field(1e-3, gt=0)


class CodeCopyingSpec(Section):
    """Copying in real code after copy pretraining (lego/engine/code_copying.py): spans recurring in the Python
    standard library's source, whose tokens repeat as a statement's and a fix's do, unlike random ids."""

    enabled: bool = False
    max_steps: int = Field(1500, ge=1)
    min_steps: int = Field(600, ge=1)  # the warm start that copied held-out fixes came after 600 steps
    max_length: int = Field(1600, ge=256)  # as copy pretraining's: a harness prompt's length
    # The share of recurring code tokens copied (argmax, whole vocabulary, held-out files, `max_length` rows) that
    # ends the phase once `min_steps` are done.
    target: float = Field(0.7, gt=0, le=1)
    lr: float = Field(1e-3, gt=0)


class TinyModelSpec(Section):
    """The random-init Qwen3-MoE used by the embedded default."""

    hidden_size: int = Field(64, ge=16)
    num_hidden_layers: int = Field(2, ge=1)
    num_attention_heads: int = Field(4, ge=1)
    num_key_value_heads: int = Field(2, ge=1)
    head_dim: int = Field(16, ge=4)
    num_experts: int = Field(4, ge=2)
    num_experts_per_tok: int = Field(2, ge=1)
    moe_intermediate_size: int = Field(128, ge=8)
    intermediate_size: int = Field(256, ge=8)
    max_position_embeddings: int = Field(32768, ge=512)
    # The initial weights' seed; unset: project.seed. A bench's seeds can share one pretrained base this way (made
    # once, like a hub checkpoint, but by the same command) and differ in the warm start and RL.
    seed: int | None = None
    copy_pretraining: CopyPretrainingSpec = Field(default_factory=CopyPretrainingSpec)
    code_copying: CodeCopyingSpec = Field(default_factory=CodeCopyingSpec)

    @model_validator(mode="after")
    def _top_k_fits(self) -> TinyModelSpec:
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError("num_experts_per_tok must not exceed num_experts")
        if self.code_copying.enabled and not self.copy_pretraining.enabled:
            raise ValueError("model.init.code_copying refines the copying that copy pretraining forms: enable "
                             "model.init.copy_pretraining too, or turn code_copying off")
        if self.code_copying.min_steps > self.code_copying.max_steps:
            raise ValueError("model.init.code_copying.min_steps must not exceed its max_steps")
        return self


class ModelConfig(Section):
    # A checkpoint directory; empty means <work_dir>/models/<name>, created by `lego model init`.
    path: Path | None = None
    name: str = "tiny-qwen3-moe"
    tokenizer: Literal["qwen3"] = "qwen3"
    init: TinyModelSpec = Field(default_factory=TinyModelSpec)
    context_length: int = Field(16384, ge=256)


class EngineConfig(Section):
    kind: Literal["transformers", "vllm", "scripted"] = "transformers"
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    device: str = "cpu"
    max_batch_size: int = Field(8, ge=1)
    batch_wait_ms: float = Field(5.0, ge=0)


class SamplingConfig(Section):
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int = Field(256, ge=1)


class TaskSetConfig(Section):
    source: str = "bundled"  # "bundled", a JSONL/Parquet path, a datasets dir, a Harbor dir, or a hub name
    split: Literal["train", "eval", "all"] = "train"
    eval_split: Literal["train", "eval", "all"] = "eval"
    limit: int | None = Field(None, ge=1)
    strict: bool = False


class HarborSandboxConfig(Section):
    """Harbor (PyPI `harbor`, in its own Python >= 3.12 venv) as the sandbox backend: lego/sandbox/harbor_backend.py."""

    # Harbor's environment type (harbor.models.environment_type.EnvironmentType: docker, daytona, modal, e2b, ...),
    # or a custom environment class by import path ("module.path:ClassName", Harbor's custom-environment hook).
    environment: str = "docker"
    import_path: str | None = None
    # Harbor's environment options (`harbor run --ek key=value`), passed to the environment's constructor.
    options: dict[str, str | int | float | bool] = Field(default_factory=dict)
    venv: str | None = None  # None: LEGO_HARBOR_VENV, <work_dir>/harbor-venv, then the machine cache (setup.sh makes it)
    start_timeout_s: float = Field(600.0, gt=0)  # building and starting the environment
    force_build: bool = False


class SandboxConfig(Section):
    cpus: float = Field(1.0, gt=0)
    memory: str = "2g"
    pids_limit: int = Field(512, ge=16)
    exec_timeout_s: float = Field(120.0, gt=0)
    output_limit_bytes: int = Field(1_000_000, ge=1024)
    disk_limit_mb: int = Field(1024, ge=64)
    # Where rollout sandboxes run: Lego's own Docker backend, or Harbor's environments (grading stays Lego's).
    backend: Literal["docker", "harbor"] = "docker"
    harbor: HarborSandboxConfig = Field(default_factory=HarborSandboxConfig)


class HarnessConfig(Section):
    name: str = "mini-swe-agent"
    version: str | None = None
    max_turns: int = Field(8, ge=1)
    timeout_s: float = Field(300.0, gt=0)
    extra: dict[str, Any] = Field(default_factory=dict)
    # A beside harness's heavy imports paid once per rollout worker, each rollout a fork (lego.harness.forkserver).
    forkserver: bool = True


class FilterConfig(Section):
    enabled: bool = True
    attempts: int = Field(4, ge=1)
    min_solved: int = Field(1, ge=0)
    max_solved: int | None = None  # None: attempts - 1


class RolloutConfig(Section):
    samples_per_task: int = Field(4, ge=1)
    # False: RL's rollouts leave out the tasks the warm start demonstrated (warmstart.tasks), which a warm-started
    # policy recalls at a low temperature every time: groups with no signal, a rollout budget spent on nothing.
    practise_demonstrated: bool = True
    concurrency: int = Field(2, ge=1)
    infra_retries: int = Field(2, ge=0)


class VerifyConfig(Section):
    timeout_s: float = Field(300.0, gt=0)
    concurrency: int = Field(2, ge=1)  # gradings at once, each in a fresh sandbox of its own
    infra_retries: int = Field(2, ge=0)
    # The largest diff a rollout may hand in. SWE-bench gold patches are a few KiB (the largest, tens of KiB);
    # 4 MiB leaves room for legitimate vendored or generated files while keeping grading time bounded. A diff
    # over it ends the rollout `patch_too_large` (reward 0) without being transferred, and the verifier refuses
    # to grade one: a patch is never cut and graded in part.
    max_patch_bytes: int = Field(4 << 20, ge=1024)
    # Decoys per graded test (lego/verify/decoys/): a blind forger survives a test with probability 1/(k+1).
    decoys_per_test: int = Field(2, ge=1, le=8)
    # PASS_TO_PASS tests that also get decoys at a grading, drawn anew each time (every FAIL_TO_PASS test has them).
    decoy_pass_to_pass_sample: int = Field(2, ge=0)


class DataConfig(Section):
    min_valid_per_group: int = Field(2, ge=1)
    advantage_epsilon: float = 1e-6
    norm_adv_by_std: bool = True


class TrainConfig(Section):
    policy_loss: str = "vanilla"  # a name in verl's policy-loss registry
    loss_agg_mode: str = "token-mean"
    lr: float = Field(1e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28
    kl_coef: float = Field(0.0, ge=0)
    epochs: int = Field(1, ge=1)
    micro_batch_tokens: int = Field(4096, ge=64)
    router_replay: Literal["R3", "disabled"] = "R3"
    dtype: Literal["float32", "bfloat16"] = "float32"
    kl_type: str = "low_var_kl"  # verl kl_penalty estimator for the kl_coef term (against TrainBatch.ref_logprobs)
    entropy_coeff: float = Field(0.0, ge=0)
    measure_routing_drift: bool = True  # one extra no-grad forward per micro-batch without replay
    # The change of the trained sequences' log-probs across the step, by advantage sign (Trainer.update_effect):
    # one extra no-grad forward over them after the last optimizer step
    measure_update: bool = True
    # Save the optimizer's state with each policy checkpoint and continue it in the next train stage (the warm
    # start's too): one optimization across iterations, as in one verl job. False: a fresh AdamW per stage.
    resume_optimizer: bool = True
    # Where a rollout's advantage goes among its sampled tokens (lego/train/credit.py): `sequence`, GRPO's, every
    # token the same; `forks`, the same total moved to the tokens where the group's outcomes split.
    credit: Literal["sequence", "forks"] = "sequence"
    # The weight of negative advantages in the policy loss. 1: GRPO as verl computes it. Below 1, the rollouts that
    # did worse than their group push less (asymmetric REINFORCE); 0 learns from the rollouts that did better only,
    # which on 0/1 rewards is REINFORCE with a zero baseline (rejection-sampling fine-tuning, RAFT).
    negative_advantage_weight: float = Field(1.0, ge=0, le=1)
    # The advantage estimator. `grpo`: the dataset stage's group-normalized advantages (verl's GRPO). `success_mass`
    # (lego/train/success_mass.py): each found success weighted by its share of the probability of the group's
    # found successes; for a policy that resolves its tasks mostly one way (after a warm start). Two baselines
    # (`lego bench learn`'s arms): `rft`, rejection-sampling fine-tuning: each resolved rollout advantage 1, the
    # others 0 (supervised learning on the policy's own successes); `sft`, continued supervised fine-tuning on the
    # warm start's demonstrations instead of the rollouts (`epochs` full-batch steps at `lr`, as the other arms).
    adv_estimator: Literal["grpo", "success_mass", "rft", "sft"] = "grpo"

    @property
    def trains_on_rollouts(self) -> bool:
        """Whether an iteration's update reads its rollouts: `sft` trains on the demonstrations alone, so its
        iterations sample and grade nothing."""
        return self.adv_estimator != "sft"

    @model_validator(mode="after")
    def _one_credit_rule(self) -> TrainConfig:
        if self.adv_estimator != "grpo" and self.credit != "sequence":
            raise ValueError(f"train.adv_estimator {self.adv_estimator} gives each rollout one advantage for all its "
                             "tokens; set train.credit: sequence (forks places GRPO's advantages only)")
        return self


class WarmStartConfig(Section):
    """Supervised fine-tuning on gold demonstrations before RL: the configured harness, unmodified, runs each
    training task under a scripted policy that applies the task's gold patch with the harness's own tools; the
    trajectories the verifier grades resolved are the data (loss on the sampled tokens only)."""

    enabled: bool = False
    # Demonstrate only the first N training tasks (None: all). RL then practises the others with no demonstration
    # to replay: where the skill must be used rather than a memorized reply recalled (docs/learning.md).
    tasks: int | None = Field(None, ge=1)
    steps: int = Field(200, ge=1)  # optimizer steps, each on one demonstration (cycled in a seeded order)
    # Stop at the end of the first pass over the demonstrations whose mean loss (per sampled token) is at most this;
    # `steps` is then the most it may take. Memorization sets in abruptly and at a step count that varies from run
    # to run, so a loss lands the policy at a more repeatable resolved rate than a step count does.
    stop_at_loss: float | None = Field(None, gt=0)
    # Stop at the end of the first pass in which every demonstration's reply (all its sampled tokens) had at least
    # this probability under the policy: about how often an attempt sampling at temperature 1 reproduces it. Unlike
    # a mean loss, it holds for each task, so that every GRPO group can find a success.
    stop_at_probability: float | None = Field(None, gt=0, lt=1)
    # "one": a demonstration per optimizer step, in a seeded order; a number: that many per step; "all": every
    # demonstration in each step (a full-batch gradient, steadier at a high rate).
    step_batch: Literal["one", "all"] | Annotated[int, Field(ge=1)] = "one"
    lr: float = Field(1e-3, gt=0)
    # `constant`, or `cosine`: from `lr` down to 0 at `steps`, so that a run whose loss still jumps about at a high
    # rate settles instead of running out of steps above `stop_at_loss`.
    lr_schedule: Literal["constant", "cosine"] = "constant"
    grad_clip: float = Field(1.0, gt=0)


class EvalConfig(Section):
    every: int = Field(1, ge=1)
    # Which splits an evaluation measures: the held-out `eval` split, and the `train` split RL trains on (the
    # learning curve: does RL raise the resolved rate on the tasks it practises?).
    splits: list[Literal["eval", "train"]] = Field(default_factory=lambda: ["eval"], min_length=1)
    at_start: bool = False  # also evaluate the policy RL starts from (after the warm start): stage `baseline`
    samples_per_task: int = Field(1, ge=1)
    # Attempts per task on one split, where it differs from samples_per_task: a small held-out split needs more
    # attempts for its rate to tell a change from noise.
    samples_per_split: dict[Literal["eval", "train"], int] = Field(default_factory=dict)
    confidence: float = Field(0.95, gt=0, lt=1)
    limit: int | None = Field(None, ge=1)  # evaluation tasks (None: the whole eval split)
    # The sampling temperature of evaluation attempts (None: sampling.temperature, the one RL samples at).
    temperature: float | None = Field(None, ge=0)
    # The least share of planned attempts that must be graded (not lost to infra failures) for a resolved
    # rate to be reported: below it the evaluation says it fell short instead of printing a number.
    min_coverage: float = Field(0.9, ge=0, le=1)

    @model_validator(mode="after")
    def _samples_are_positive(self) -> EvalConfig:
        if any(samples < 1 for samples in self.samples_per_split.values()):
            raise ValueError("eval.samples_per_split: every split needs at least 1 attempt per task")
        return self

    def samples_for(self, split: str) -> int:
        return self.samples_per_split.get(split, self.samples_per_task)


class RayPlacement(Section):
    """Ray's resource request for a stage placed on the cluster: it runs on a node that has these free."""

    num_cpus: float = Field(1.0, ge=0)
    num_gpus: float = Field(0.0, ge=0)
    # A node's own resources, as `ray start --resources '{"trainer": 1}'` declares them: pins a stage to such nodes.
    resources: dict[str, float] = Field(default_factory=dict)

    def ray_options(self) -> dict[str, Any]:
        return {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus, "resources": dict(self.resources)}

    def unmet_by(self, nodes: list[dict[str, float]]) -> dict[str, float] | None:
        """None when one of these nodes (each its total resources, as `ray.nodes()` lists them) has all this asks
        for; else what the best-fitting node lacks. Ray would wait for ever for a node that has it."""
        wanted = {name: amount for name, amount in {"CPU": self.num_cpus, "GPU": self.num_gpus, **self.resources}.items()
                  if amount > 0}
        shortfalls = [{name: amount for name, amount in wanted.items() if amount > node.get(name, 0.0)}
                      for node in nodes]
        if any(not shortfall for shortfall in shortfalls):
            return None
        return min(shortfalls, key=len, default=wanted)


class PipelineConfig(Section):
    iterations: int = Field(1, ge=1)
    # How rollouts and their grading fan out: Prefect's thread pool, or Ray (prefect-ray) where installed.
    task_runner: Literal["thread", "ray"] = "thread"
    rollout_shards: int = Field(1, ge=1)  # rollout requests are split into this many Prefect tasks
    # The verify stage's rollouts are graded in this many Prefect tasks, each on its worker's engine (None: as many
    # as rollout_shards; 1: graded in the flow's own process).
    verify_shards: int | None = Field(None, ge=1)
    ray_address: str | None = None  # None: a local Ray; "auto" or ray://host:10001 for a cluster
    # A fanned-out stage fails (StageStalledError) when its shards store no rollout (rollout) or no outcome (verify)
    # for this long while still running: a node that lost power or its link never closes its connections, and the
    # driver would wait for ever. It must exceed the longest gap between two stored records: a task image's first
    # build, then a whole attempt or grading. None: wait for ever.
    stall_timeout_s: float | None = Field(3600.0, gt=0)
    # Stages that run as one Ray task on a node with the resources asked for (training on a GPU node, evaluation
    # beside a node's engine), reading and writing the shared work dir; a stage not named runs in the flow's process.
    placement: dict[Literal["train", "evaluate"], RayPlacement] = Field(default_factory=dict)
    # "package.module:Class" to replace the real rollout/grading stack (tests); None: the real one.
    runner: str | None = None

    @model_validator(mode="after")
    def _placement_needs_ray(self) -> PipelineConfig:
        if self.placement and self.task_runner != "ray":
            raise ValueError(f"pipeline.placement places {', '.join(sorted(self.placement))} on a Ray cluster; set "
                             "pipeline.task_runner: ray (and pipeline.ray_address), or remove pipeline.placement")
        return self


class TrackingConfig(Section):
    # None: sqlite under the work dir.
    mlflow_uri: str | None = None
    experiment: str | None = None
    traces: bool = True  # every rollout as an MLflow trace (lego/track/traces.py)


class ScheduleConfig(Section):
    cron: str = "0 3 * * *"
    stages: dict[str, str] = Field(default_factory=dict)  # stage name -> cron, run from the latest run
    interval_s: float | None = Field(None, gt=0)  # instead of cron for the pipeline (tests, tight loops)


class LegoConfig(Section):
    project: ProjectConfig = Field(default_factory=ProjectConfig)
    docker: DockerConfig = Field(default_factory=DockerConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    tasks: TaskSetConfig = Field(default_factory=TaskSetConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    harness: HarnessConfig = Field(default_factory=HarnessConfig)
    filter: FilterConfig = Field(default_factory=FilterConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    verify: VerifyConfig = Field(default_factory=VerifyConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    warmstart: WarmStartConfig = Field(default_factory=WarmStartConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    pipeline: PipelineConfig = Field(default_factory=PipelineConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)

    def section_dict(self, name: str) -> dict[str, Any]:
        return getattr(self, name).model_dump(mode="json")

    @model_validator(mode="after")
    def _practised_tasks_are_known(self) -> LegoConfig:
        if self.rollout.practise_demonstrated:
            return self
        if not self.warmstart.enabled or self.warmstart.tasks is None:
            raise ValueError("rollout.practise_demonstrated: false leaves out the tasks the warm start demonstrated; "
                             "it needs warmstart.enabled: true and warmstart.tasks: N (the first N training tasks)")
        if self.filter.enabled:
            raise ValueError("rollout.practise_demonstrated: false and filter.enabled: true both pick RL's tasks; "
                             "keep one (the filter drops tasks the policy always solves, at the cost of attempts)")
        return self


def _resolve_config_path(name_or_path: str | Path, relative_to: Path | None = None) -> Path:
    candidate = Path(name_or_path)
    options = [candidate]
    if relative_to is not None:
        options.append(relative_to / candidate)
    options.append(CONFIGS_DIR / candidate)
    if candidate.suffix == "":
        options.append(CONFIGS_DIR / f"{candidate}.yaml")
    for option in options:
        if option.is_file():
            return option.resolve()
    raise ConfigError(
        f"config {str(name_or_path)!r} not found (looked in {', '.join(str(o) for o in options)}); "
        f"pass a path to a YAML file or a name from {CONFIGS_DIR}"
    )


def _deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    if path in seen:
        raise ConfigError(f"config {path} extends itself through 'base:' ({' -> '.join(map(str, seen))})")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config {path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config {path} must be a mapping of sections, got {type(data).__name__}")
    base = data.pop("base", None)
    if base is not None:
        parent = _read_yaml(_resolve_config_path(base, path.parent), (*seen, path))
        data = _deep_merge(parent, data)
    return data


def parse_override(override: str) -> tuple[list[str], Any]:
    if "=" not in override:
        raise ConfigError(f"override {override!r} must look like section.key=value (for example train.lr=1e-5)")
    key, raw = override.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {override!r} has an empty key; use section.key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    data = _deep_merge({}, data)
    for override in overrides:
        path, value = parse_override(override)
        node = data
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                raise ConfigError(f"override {override!r}: {part!r} is a value, not a section")
            node = child
        node[path[-1]] = value
    return data


def _format_validation_error(exc: ValidationError, source: str) -> str:
    lines = [f"invalid config ({source}):"]
    for error in exc.errors():
        key = ".".join(str(part) for part in error["loc"])
        value = error.get("input")
        if error["type"] == "extra_forbidden":
            lines.append(f"  {key}: unknown key (value {value!r}); check the spelling against configs/default.yaml")
        else:
            lines.append(f"  {key} = {value!r}: {error['msg']}")
    return "\n".join(lines)


# Where the environment moves every config's work dir (an explicit project.work_dir= override still wins): one
# machine running several independent copies of a command, such as the test suite's parallel workers, gives each its
# own catalog, MLflow store and artifacts without editing a config.
WORK_DIR_ENV = "LEGO_WORK_DIR"


def load_config(name_or_path: str | Path = "default", overrides: list[str] | None = None) -> LegoConfig:
    path = _resolve_config_path(name_or_path)
    from_env = [f"project.work_dir={os.environ[WORK_DIR_ENV]}"] if os.environ.get(WORK_DIR_ENV) else []
    data = apply_overrides(_read_yaml(path), [*from_env, *(overrides or [])])
    try:
        return LegoConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc, str(path))) from None


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted keys for MLflow params."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{dotted}."))
        else:
            flat[dotted] = value
    return flat
