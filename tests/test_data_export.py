"""Export: verl's RL parquet (read back by verl's own RLHFDataset) and padded actor tensors; the `lego data` CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from lego.data.batches import TrainingSample
from lego.data.export import build_verl_batch, read_verl_rl_dataset, write_verl_rl_dataset
from lego.data.synthetic import synthetic_trajectory
from lego.data.writer import DatasetWriter
from lego.records import Outcome, OutcomeKind
from lego.tasksets.task import Task
from lego.workdir import WorkDir
from lego_cli import app


def sample(token_ids, mask, advantage, layers=2, top_k=2, name="r"):
    token_ids = np.asarray(token_ids, np.int32)
    mask = np.asarray(mask, np.uint8)
    logprobs = np.where(mask == 1, -0.5, 0.0).astype(np.float32)
    routing = np.arange(len(token_ids) * layers * top_k, dtype=np.uint8).reshape(len(token_ids), layers, top_k)
    return TrainingSample(rollout_id=name, task_id="t", iteration=0, segment_index=0, thread="main",
                          token_ids=token_ids, response_mask=mask, logprobs=logprobs, advantage=advantage,
                          routed_experts=routing, reward=1.0, is_cheat=False, policy_version=0)


def test_verl_batch_left_pads_prompts_and_right_pads_responses():
    a = sample([11, 12, 13, 21, 22, 31, 23], [0, 0, 0, 1, 1, 0, 1], 0.5, name="a")  # prompt 3, response 4
    b = sample([14, 24], [0, 1], -1.0, name="b")  # prompt 1, response 1
    batch = build_verl_batch([a, b], pad_token_id=0)
    assert batch["input_ids"].tolist() == [[11, 12, 13, 21, 22, 31, 23], [0, 0, 14, 24, 0, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1] * 7, [0, 0, 1, 1, 0, 0, 0]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 4, 5, 6], [0, 0, 0, 1, 1, 1, 1]]
    assert batch["prompts"].shape == (2, 3) and batch["responses"].tolist() == [[21, 22, 31, 23], [24, 0, 0, 0]]
    assert batch["response_mask"].tolist() == [[1, 1, 0, 1], [1, 0, 0, 0]]
    np.testing.assert_array_equal(batch["advantages"], [[0.5, 0.5, 0, 0.5], [-1, 0, 0, 0]])
    np.testing.assert_array_equal(batch["old_log_probs"], [[-0.5, -0.5, 0, -0.5], [-0.5, 0, 0, 0]])
    routed = batch["routed_experts"]
    assert routed.shape == (2, 7, 2, 2) and routed.dtype == np.uint8
    np.testing.assert_array_equal(routed[1, 2:4], b.routed_experts)
    assert not routed[1, :2].any() and not routed[1, 4:].any()
    np.testing.assert_array_equal(routed[0], a.routed_experts)


TASK = Task(instance_id="calc__1", repo="lego/calc", base_commit="abc123", problem_statement="add() is wrong",
            FAIL_TO_PASS=["tests/test_calc.py::test_add"], PASS_TO_PASS=["tests/test_calc.py::test_sub"])


def test_rl_parquet_loads_in_verl(tmp_path):
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from lego.engine.tokenizer import load_tokenizer

    path = write_verl_rl_dataset([TASK], tmp_path / "rl.parquet", agent_name="lego")
    row = read_verl_rl_dataset(path)[0]
    assert row["prompt"] == [{"role": "user", "content": "add() is wrong"}]
    assert json.loads(row["reward_model"]["ground_truth"])["FAIL_TO_PASS"] == TASK.FAIL_TO_PASS
    assert Task.model_validate_json(row["extra_info"]["task_json"]) == TASK
    config = OmegaConf.create({"max_prompt_length": 512, "filter_overlong_prompts": False,
                               "cache_dir": str(tmp_path / "cache")})
    dataset = RLHFDataset(str(path), load_tokenizer(), config)
    item = dataset[0]
    assert item["agent_name"] == "lego"
    assert item["raw_prompt"] == row["prompt"]


def test_cli_show_and_export(tmp_path):
    work = WorkDir(tmp_path / "work")
    rng = np.random.default_rng(0)
    writer = DatasetWriter(work, "run-a")
    writer.append_tasks([TASK])
    trajectories = [synthetic_trajectory(rng, f"r{i}", "calc__1", sample_index=i, tokens_per_segment=60)
                    for i in range(3)]
    for trajectory in trajectories:
        trajectory.segments[0].response_mask[-5:] = 1
    writer.append_trajectories(trajectories)
    writer.append_outcomes([Outcome("r0", "calc__1", OutcomeKind.resolved),
                            Outcome("r1", "calc__1", OutcomeKind.unresolved),
                            Outcome("r2", "calc__1", OutcomeKind.infra_error)], iteration=0)
    runner = CliRunner()
    override = f"project.work_dir={work.root}"
    shown = runner.invoke(app, ["data", "show", override], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert "segments" in shown.output and "run-a" in shown.output and "0.500" in shown.output
    out = tmp_path / "export"
    exported = runner.invoke(app, ["data", "export", "--run", "run-a", "--iteration", "0", "--out", str(out),
                                   override])
    assert exported.exit_code == 0, exported.output
    summary = json.loads(exported.output)
    assert summary["sequences"] == 2 and summary["tasks"] == 1
    with np.load(out / "batch.npz") as batch:
        assert batch["routed_experts"].shape[0] == 2 and batch["routed_experts"].shape[2:] == (2, 2)
        assert sorted(set(batch["advantages"][batch["response_mask"] == 1].round(4))) == [-0.7071, 0.7071]
    assert read_verl_rl_dataset(out / "rl_dataset.parquet")[0]["extra_info"]["instance_id"] == "calc__1"
    missing = runner.invoke(app, ["data", "export", "--run", "nope", "--iteration", "0", "--out", str(out),
                                  override])
    assert missing.exit_code != 0


@pytest.mark.parametrize("routing", [None])
def test_verl_batch_without_routing(routing):
    a = sample([1, 2], [0, 1], 1.0)
    a.routed_experts = routing
    assert "routed_experts" not in build_verl_batch([a])


def test_an_exported_row_is_what_the_verl_agent_loop_runs(tmp_path):
    """`lego data export` rows name the registered agent loop, and the loop reads their task back."""
    from lego.train.verl_agent_loop import AGENT_NAME, task_from_row

    path = write_verl_rl_dataset([TASK], tmp_path / "rl.parquet")
    row = read_verl_rl_dataset(path)[0]
    assert row["agent_name"] == AGENT_NAME == "lego_harness"
    assert task_from_row({"extra_info": row["extra_info"]}) == TASK
