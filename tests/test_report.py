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
