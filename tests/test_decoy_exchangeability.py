"""A forger that reads a group of tests in the sandbox cannot tell the real one from its decoys (pure, no Docker).

Over the bundled repositories' test modules (every test treated as graded, every candidate as validated), many
gradings' layouts are drawn, and simple strategies pick a member of each group from what the sandbox holds: the
first or last in the file, the shortest or longest value, the value the rest of the module mentions most or least,
the value found inside the module's other text (a fixture) or not, the median. For a changed value none may do
much better than a blind guess (1/3 with two decoys). `lego bench decoys` reports the same on validated plans, per
site kind (exception swaps and flipped truths are weaker; docs/benchmarks.md).
"""

from __future__ import annotations

import ast
import random
import statistics
from pathlib import Path

from lego.bench.decoys import strategy_hits
from lego.verify.decoys import DecoyPlan, build_layout, plan_candidates

SOURCES = Path(__file__).resolve().parents[1] / "lego" / "tasksets" / "bundled" / "sources"
DRAWS = 25
SLACK = 0.12  # over the blind 1/3, for the sample's spread (about 2,000 groups) and the strategies' ties


def test_no_reading_strategy_finds_the_real_value_among_its_decoys_much_above_chance():
    hits: dict[str, list[int]] = {}
    for path in sorted(SOURCES.glob("*/tests/test_*.py")):
        relative = str(path.relative_to(path.parents[1]))
        source = path.read_text()
        tests = [f"{relative}::{node.name}" for node in ast.parse(source).body
                 if isinstance(node, ast.FunctionDef) and node.name.startswith("test")]
        plan = DecoyPlan(tests=plan_candidates(source, tests, 2, random.Random(0)))
        rng = random.Random(relative)
        for draw in range(DRAWS):
            layout = build_layout({relative: source}, plan, tests, [], k=2, pass_to_pass_sample=0,
                                  rng=random.Random(f"{relative}:{draw}"))
            for kind, size, picks in strategy_hits(layout, tests, rng):
                if kind == "value" and size == 2:
                    for strategy, hit in picks.items():
                        hits.setdefault(strategy, []).append(hit)
    assert len(hits["random"]) > 1000
    rates = {strategy: statistics.fmean(values) for strategy, values in hits.items()}
    assert {"first_in_file", "shortest", "most_mentioned", "found_in_other_text", "median"} <= set(rates)
    assert all(rate < 1 / 3 + SLACK for rate in rates.values()), rates
    assert all(rate > 1 / 3 - SLACK for rate in rates.values()), rates  # far below would mean its opposite wins
