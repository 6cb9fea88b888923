import pytest

from lego.config import LegoConfig, apply_overrides, flatten, load_config
from lego.errors import ConfigError


def test_default_config_loads_and_is_the_embedded_default():
    config = load_config("default")
    assert isinstance(config, LegoConfig)
    assert config.engine.kind == "transformers"
    assert config.harness.name == "mini-swe-agent"
    assert config.model.init.num_experts_per_tok == 2


def test_base_file_is_extended():
    config = load_config("test")
    assert config.project.name == "lego-test"
    assert config.harness.name == "mini-swe-agent"  # inherited from default.yaml


def test_overrides_are_typed():
    config = load_config("default", ["train.lr=3e-5", "rollout.samples_per_task=8", "tasks.limit=2",
                                     "harness.extra.flag=true"])
    assert config.train.lr == pytest.approx(3e-5)
    assert config.rollout.samples_per_task == 8
    assert config.tasks.limit == 2
    assert config.harness.extra == {"flag": True}


def test_bad_value_names_key_value_and_expectation():
    with pytest.raises(ConfigError) as info:
        load_config("default", ["rollout.samples_per_task=many"])
    message = str(info.value)
    assert "rollout.samples_per_task" in message and "'many'" in message and "integer" in message


def test_unknown_key_is_rejected_with_its_name():
    with pytest.raises(ConfigError) as info:
        load_config("default", ["train.learning_rate=1"])
    assert "train.learning_rate" in str(info.value) and "unknown key" in str(info.value)


def test_constraint_violation_is_explained():
    with pytest.raises(ConfigError) as info:
        load_config("default", ["model.init.num_experts_per_tok=9"])
    assert "num_experts_per_tok" in str(info.value)


def test_malformed_override_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="section.key=value"):
        load_config("default", ["train.lr"])
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="'lr' is a value"):
        apply_overrides({"train": {"lr": 1}}, ["train.lr.x=2"])


def test_invalid_yaml_and_non_mapping(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    listy = tmp_path / "list.yaml"
    listy.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(listy)


def test_self_extending_config_is_caught(tmp_path):
    loop = tmp_path / "loop.yaml"
    loop.write_text(f"base: {loop}\n")
    with pytest.raises(ConfigError, match="extends itself"):
        load_config(loop)


def test_flatten_for_mlflow_params():
    flat = flatten(load_config("default").model_dump(mode="json"))
    assert flat["train.lr"] == pytest.approx(3e-4)
    assert "model.init.hidden_size" in flat


def test_a_placed_stage_needs_ray_and_a_node_that_has_what_it_asks_for():
    from lego.config import RayPlacement

    with pytest.raises(ConfigError, match="set pipeline.task_runner: ray"):
        load_config("test", ["pipeline.placement.train.num_gpus=1"])
    config = load_config("test", ["pipeline.task_runner=ray", "pipeline.placement.train.num_gpus=1",
                                  "pipeline.placement.evaluate.resources.worker2=1"])
    train, evaluate = config.pipeline.placement["train"], config.pipeline.placement["evaluate"]
    assert train.ray_options() == {"num_cpus": 1.0, "num_gpus": 1.0, "resources": {}}
    with pytest.raises(ConfigError, match="placement"):
        load_config("test", ["pipeline.task_runner=ray", "pipeline.placement.rollout.num_cpus=1"])  # not placeable
    head, cpu_node, gpu_node = {"CPU": 0.0}, {"CPU": 1.0, "worker1": 1.0}, {"CPU": 8.0, "GPU": 1.0, "worker2": 1.0}
    assert train.unmet_by([head, cpu_node, gpu_node]) is None
    assert train.unmet_by([head, cpu_node]) == {"GPU": 1.0}  # Ray would wait for ever: the flow says so instead
    assert evaluate.unmet_by([cpu_node]) == {"worker2": 1.0}
    assert RayPlacement(num_cpus=2).unmet_by([]) == {"CPU": 2.0}
