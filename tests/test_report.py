"""lego.pipeline.report: a stage's one line in `lego run` and `lego stage` output."""

from __future__ import annotations

import socket

from lego.pipeline.artifacts import StageResult
from lego.pipeline.report import stage_line


def test_a_stage_computed_on_another_node_says_which():
    here = StageResult(stage="train", iteration=0, key="k", path="/p", seconds=41.0, host=socket.gethostname(),
                       metrics={"trained": 1.0})
    assert stage_line(here).endswith("(41.0 s)")
    placed = here.model_copy(update={"host": "worker1"})
    assert stage_line(placed).endswith("(41.0 s on worker1)")
    assert stage_line(placed.model_copy(update={"cached": True})).endswith("(from cache)")
    assert stage_line(here.model_copy(update={"host": ""})).endswith("(41.0 s)")  # a result from before `host`


def test_a_train_line_says_what_the_update_ran_on():
    def line(metrics: dict[str, float]) -> str:
        return stage_line(StageResult(stage="train", iteration=0, key="k", path="/p", seconds=96.0,
                                      host=socket.gethostname(), metrics=metrics))

    # `train.adv_estimator: sft` fine-tunes on the warm start's demonstrations: it has no GRPO groups to count
    sft = line({"trained": 1.0, "optimizer_steps": 4.0, "sequences": 32.0, "loss": 0.0065})
    assert "4 optimizer step(s) on 32 demonstrations, loss 0.0065" in sft and "groups" not in sft
    rl = line({"trained": 1.0, "optimizer_steps": 4.0, "sequences": 575.0, "sequences_trained": 54.0,
               "groups": 128.0, "groups_with_signal": 28.0, "logprob_change_positive": 0.51})
    assert "4 optimizer step(s) on 54 of 575 sequences (28 of 128 groups with signal); successes' log-prob +0.51" in rl
    assert line({"trained": 0.0, "groups": 128.0, "groups_with_signal": 0.0}).endswith(
        "0 of 128 groups with signal; no update  (1 min 36 s)")
