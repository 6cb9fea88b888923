"""Decoys on the real Docker engine: made once under the gold patch and cached, drawn anew at every grading, and
nothing in the grading sandbox tells a real test from its decoys."""

from __future__ import annotations

import ast

import pytest
from repo_fixtures import GOLD_PATCH

from lego.verify import Verifier
from lego.verify.decoys import NodeId
from lego.verify.pytest_grading import RUNNER_DIR, RUNNER_MOUNT, decoy_plan_key

pytestmark = pytest.mark.docker


class CountingFactory:
    """The real factory, counting the sandboxes opened (a cached plan opens none)."""

    def __init__(self, inner):
        self.inner, self.opened = inner, []

    def open_task(self, task, *, purpose, **kwargs):
        self.opened.append(purpose)
        return self.inner.open_task(task, purpose=purpose, **kwargs)


def test_the_plan_is_validated_under_gold_once_and_then_read_from_the_cache(docker_engine, base_image, lego_config,
                                                                           factory, calc_task, tmp_path, monkeypatch):
    monkeypatch.setenv("LEGO_CACHE_DIR", str(tmp_path))
    counting = CountingFactory(factory)
    first = Verifier(docker_engine.client, base_image, lego_config.sandbox, lego_config.verify, factory=counting)
    plan = first.pytest_grading.decoy_plan(calc_task)
    assert counting.opened == ["verify-decoys"]
    assert plan.coverage(calc_task.FAIL_TO_PASS, 2) == {"tests/test_calc.py::test_add": 2}
    assert (tmp_path / "decoys" / f"{decoy_plan_key(calc_task, 2)}.json").is_file()
    # Every kept variant failed under the gold patch; `add(2, 3) == 5` itself is never among them.
    values = {variant.replacement for pool in plan.tests["tests/test_calc.py::test_add"].pools
              for variant in pool.variants}
    assert "5" not in values and values
    again = Verifier(docker_engine.client, base_image, lego_config.sandbox, lego_config.verify, factory=counting)
    assert again.pytest_grading.decoy_plan(calc_task) == plan and counting.opened == ["verify-decoys"]


def test_a_task_without_a_gold_patch_grades_without_decoys_and_says_why(verifier, calc_task):
    bare = calc_task.model_copy(update={"patch": "", "instance_id": "calc__calc-nogold"})
    outcome = verifier.verify(bare, diff=GOLD_PATCH, actions=[])
    assert outcome.kind == "resolved" and outcome.evidence["decoys"]["count"] == 0
    assert "no gold patch" in outcome.evidence["decoys"]["plan"]


def test_two_gradings_of_one_patch_draw_different_decoys(verifier, calc_task):
    outcomes = [verifier.verify(calc_task, diff=GOLD_PATCH, actions=[]) for _ in range(2)]
    assert [o.kind for o in outcomes] == ["resolved", "resolved"] and all(o.cheat_rules == [] for o in outcomes)
    first, second = (o.evidence["decoys"] for o in outcomes)
    assert first["drawn"]["tests/test_calc.py::test_add"]["values"] and first["count"] >= 2
    assert first["files_digest"] != second["files_digest"]


def test_the_grading_sandbox_shows_groups_but_not_which_member_is_real(verifier, factory, calc_task):
    plan = verifier.pytest_grading.decoy_plan(calc_task)
    with factory.open_task(calc_task, purpose="verify", mounts={str(RUNNER_DIR): RUNNER_MOUNT}) as sandbox:
        layout = verifier.pytest_grading.write_graded_tests(sandbox, calc_task, plan)
        source = sandbox.get_file("/repo/tests/test_calc.py").decode()
        leftovers = sandbox.exec("ls /tmp; git status --porcelain; git stash list", timeout=30).output
    # The test patch is gone, and with it the tests as they were written; the original names are gone too.
    assert "lego-test.patch" not in leftovers and "test_add" not in source and "test_mul" not in source
    module = ast.parse(source)
    functions = {node.name: node for node in module.body if isinstance(node, ast.FunctionDef)}
    real = NodeId.parse(layout.real["tests/test_calc.py::test_add"]).name
    decoys = [NodeId.parse(d).name for d in layout.decoys_of("tests/test_calc.py::test_add")]
    assert len(decoys) == 2 and {real, *decoys} <= set(functions)
    # Same shape of name, same decorators and docstring, and the bodies differ at one constant only.
    assert len({len(name) for name in [real, *decoys]}) == 1
    real_constants = [n.value for n in ast.walk(functions[real]) if isinstance(n, ast.Constant)]
    for name in decoys:
        constants = [n.value for n in ast.walk(functions[name]) if isinstance(n, ast.Constant)]
        assert len(constants) == len(real_constants)
        assert sum(a != b for a, b in zip(constants, real_constants, strict=True)) == 1
    # The order in the file is the layout's group order, which is shuffled; the spec holds no roles.
    spec = verifier.pytest_grading._spec(calc_task, layout, [], {})
    assert "role" not in str(spec) and set(spec["graded"]) == {*layout.real.values(), *layout.decoys}
