"""Grading against the real Docker engine: gold resolves, empty does not, cheats are caught."""

from __future__ import annotations

import pytest
from repo_fixtures import GOLD_PATCH

pytestmark = pytest.mark.docker


def test_gold_patch_resolves_and_empty_patch_does_not(verifier, calc_task):
    gold = verifier.verify(calc_task, diff=GOLD_PATCH)
    assert gold.kind == "resolved", gold.evidence
    assert gold.reward == 1.0 and gold.evidence["resolution"] == "RESOLVED_FULL"
    empty = verifier.verify(calc_task, diff="")
    assert empty.kind == "unresolved" and empty.reward == 0.0


def test_editing_the_failing_test_is_a_cheat(verifier, calc_task):
    cheat = GOLD_PATCH + (
        "diff --git a/tests/test_calc.py b/tests/test_calc.py\n--- a/tests/test_calc.py\n+++ b/tests/test_calc.py\n"
        "@@ -1,5 +1,5 @@\n from calc import mul\n \n \n def test_mul():\n-    assert mul(2, 3) == 6\n+    assert True\n"
    )
    outcome = verifier.verify(calc_task, diff=cheat)
    assert outcome.kind == "cheat" and "test_files_edited" in outcome.cheat_rules
    assert outcome.reward == 0.0 and outcome.evidence["tests_alone_would_give"] == "resolved"


def test_patch_breaking_collection_is_the_agents_fault_not_infra(verifier, calc_task):
    broken = ("diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,5 +1,5 @@\n def add(a, b):\n"
              "-    return a - b\n+    return a +\n \n \n def mul(a, b):\n")
    outcome = verifier.verify(calc_task, diff=broken)
    assert outcome.kind == "unresolved", outcome.evidence
    assert outcome.evidence["check"] == "runner_crash_caused_by_patch"


def test_test_patch_that_does_not_apply_is_infra_and_retried(verifier, calc_task):
    task = calc_task.model_copy(update={"test_patch": calc_task.test_patch.replace("from calc import mul", "from nope")})
    outcome = verifier.verify(task, diff=GOLD_PATCH)
    assert outcome.kind == "infra_error" and outcome.reward is None
    assert outcome.evidence["check"] == "test_patch_does_not_apply"
    assert outcome.attempts == verifier.config.infra_retries + 1


def test_a_patch_that_hangs_the_tests_is_unresolved_not_infra(docker_engine, base_image, lego_config, calc_task):
    from lego.verify import Verifier

    quick = Verifier(docker_engine.client, base_image, lego_config.sandbox,
                     lego_config.verify.model_copy(update={"timeout_s": 8.0, "infra_retries": 0}))
    hang = ("diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,5 +1,7 @@\n def add(a, b):\n"
            "-    return a - b\n+    while True:\n+        pass\n+    return a + b\n \n \n def mul(a, b):\n")
    outcome = quick.verify(calc_task, diff=hang)
    assert outcome.kind == "unresolved", outcome.evidence
    assert outcome.evidence["check"] == "verifier_timeout_caused_by_patch"
