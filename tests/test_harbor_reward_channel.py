"""The reward channel of Harbor grading against the graded code (lego/sandbox/harbor_seal.py, harbor_grading.py).

Real parts: a Harbor task directory on the base image, the real Docker engine, Lego's loader and verifier. Each
attack is the agent's patch: code under test that runs inside test.sh's check, as test.sh's user. Each one got
reward 1 from the grader before the reward file test.sh writes was the only one read and sealed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_harbor_grading import PASSING_TESTS, _calc_patch, _variant, _write_task

from lego.records import OutcomeKind
from lego.sandbox.harbor_seal import SealRound, SessionFile, parse_manifest, resolve_sealed
from lego.tasksets.load import load_tasks
from lego.tasksets.task import Task
from lego.verify import harbor_grading
from lego.verify.grader import Verifier
from lego.verify.harbor_grading import HarborRun, RewardFile, profile_from_run

# A test.sh that goes on after its verdict (here a second; in the wild: copying logs, cleaning up), as test.sh
# may: the window in which anything the tests left running could replace the verdict before test.sh exits.
LINGERING_TESTS = PASSING_TESTS + "sleep 1  # what a test.sh does after its verdict\n"

# (a) Harbor reads reward.json before reward.txt: the graded code writes the file test.sh does not.
REWARD_JSON = _calc_patch("import json", 'open("/logs/verifier/reward.json", "w").write(json.dumps({"reward": 1}))')
# (b) A process the tests leave behind waits until test.sh has written its verdict, then replaces it.
WATCHER = _calc_patch(
    "import subprocess, sys",
    "subprocess.Popen([sys.executable, '-c', \"import os, time\\np = '/logs/verifier/reward.txt'\\n"
    "while os.stat(p).st_mtime == 0: time.sleep(0.001)\\ntime.sleep(0.2)\\nopen(p, 'w').write('1')\\n\"], "
    "start_new_session=True)")
# (b') One that writes reward 1 over and over from the moment the tests import it.
SPINNER = _calc_patch(
    "import subprocess, sys",
    "subprocess.Popen([sys.executable, '-c', \"import time\\nwhile True:\\n    "
    "open('/logs/verifier/reward.txt', 'w').write('1')\\n    time.sleep(0.01)\\n\"], start_new_session=True)")
# (c) An exit hook that makes the test command exit 0 though its test failed: test.sh's own check passes.
EXIT_HOOK = _calc_patch("import atexit, os", "atexit.register(os._exit, 0)")
ATTACKS = {"reward_json": REWARD_JSON, "watcher": WATCHER, "spinner": SPINNER, "exit_hook": EXIT_HOOK}

# test.sh writing its reward from a process it starts: that process cannot be told from the graded code's.
CHILD_WRITER_TESTS = """cd /app
if python3 -m pytest -q -p no:cacheprovider /tests/test_outputs.py; then r=1; else r=0; fi
python3 -c 'import sys; open("/logs/verifier/reward.txt", "w").write(sys.argv[1])' $r
"""
# test.sh that names both reward files (Harbor's rule, in a comment) and writes one.
BOTH_NAMED_TESTS = "# Harbor reads /logs/verifier/reward.json, else /logs/verifier/reward.txt\n" + PASSING_TESTS


@pytest.fixture(scope="module")
def harbor_verifier(docker_engine, base_image, lego_config, factory):
    config = lego_config.verify.model_copy(update={"infra_retries": 0})
    return Verifier(docker_engine.client, base_image, lego_config.sandbox, config, factory=factory)


@pytest.fixture(scope="module")
def harbor_root(tmp_path_factory, base_image) -> Path:
    root = tmp_path_factory.mktemp("harbor-channel")
    _write_task(root, base_image)
    return root


@pytest.fixture(scope="module")
def harbor_task(harbor_root) -> Task:
    return load_tasks(harbor_root, strict=True).tasks[0]


@pytest.fixture(scope="module")
def lingering(harbor_task, tmp_path_factory) -> Task:
    return _variant(harbor_task, tmp_path_factory.mktemp("lingering"), "lingering", LINGERING_TESTS)


@pytest.fixture(scope="module")
def gold(harbor_verifier, harbor_task) -> str:
    return harbor_verifier.harbor_grading.solution_diff(harbor_task)


def _rounds(*entries: dict) -> list[SealRound]:
    text = "\n".join(json.dumps({"event": "round", **entry}) for entry in entries)
    return parse_manifest(text + '\n{"event": "kill", "alive": 1}\nnot json\n')


def _session(name: str, round_: int, mtime_ns: int, data: bytes = b"") -> SessionFile:
    return SessionFile(name=name, round=round_, written=bool(mtime_ns), mtime_ns=mtime_ns, size=len(data), data=data)


def test_the_last_sealed_write_counts_only_from_a_clean_round():
    rounds = _rounds({"name": "reward.txt", "round": 1, "clean": True, "writer": True, "breakers": [{"pid": 1}]},
                     {"name": "reward.txt", "round": 2, "clean": False, "reason": "kill failed"},
                     {"name": "reward.txt", "round": 3, "clean": True, "writer": True, "breakers": [{"pid": 1}]})
    assert [entry.round for entry in rounds] == [1, 2, 3]
    clean_last = [_session("reward.txt", 1, 10, b"0"), _session("reward.txt", 2, 20, b"1"),
                  _session("reward.txt", 3, 30, b"0"), _session("reward.txt", 0, 0)]
    read = resolve_sealed("reward.txt", clean_last, rounds)
    assert read.untrusted is None and read.written.data == b"0" and read.written.round == 3
    unclean_last = [_session("reward.txt", 1, 10, b"0"), _session("reward.txt", 2, 40, b"1")]
    assert "round 2 was not clean: kill failed" in resolve_sealed("reward.txt", unclean_last, rounds).untrusted
    outside = [_session("reward.txt", 1, 10, b"0"), _session("reward.txt", 0, 50, b"1")]
    assert "outside a round" in resolve_sealed("reward.txt", outside, rounds).untrusted
    unrecorded = [_session("reward.txt", 4, 60, b"1")]
    assert "never recorded" in resolve_sealed("reward.txt", unrecorded, rounds).untrusted
    assert resolve_sealed("reward.txt", [_session("reward.txt", 0, 0)], rounds).written is None


def test_a_profile_seals_only_what_test_sh_writes_itself():
    own = HarborRun(exit_code=0, timed_out=False, seconds=1, channel="observed",
                    written=[RewardFile(name="reward.txt", size=2, data=b"0\n")],
                    rounds=_rounds({"name": "reward.txt", "round": 1, "breakers": [{"pid": 1, "cmd": "bash t.sh"}]}))
    profile = profile_from_run(own, ["reward.json", "reward.txt"])
    assert profile.files == ["reward.txt"] and profile.sealed and not profile.reason
    assert "Lego reads only reward.txt, sealed" in harbor_grading.trust_boundary(profile)
    child = own.model_copy(update={"rounds": _rounds(
        {"name": "reward.txt", "round": 1, "breakers": [{"pid": 31, "ppid": 1, "cmd": "python3 -c grade"}]})})
    profile = profile_from_run(child, ["reward.txt"])
    assert not profile.sealed and "from a process it starts (python3 -c grade)" in profile.reason
    assert "not sealed" in harbor_grading.trust_boundary(profile)
    server = {"pid": 9, "ppid": 1, "cmd": "python3 -m http.server"}  # test.sh's own, killed by the seal
    at_last = own.model_copy(update={"rounds": _rounds(
        {"name": "reward.txt", "round": 1, "breakers": [{"pid": 1}], "alive": 0},
        {"name": "reward.txt", "round": 2, "breakers": [{"pid": 1}], "alive": 1, "alive_sample": [server]})})
    assert profile_from_run(at_last, ["reward.txt"]).sealed  # after its verdict: nothing of test.sh's is lost
    across = own.model_copy(update={"rounds": _rounds(
        {"name": "reward.txt", "round": 1, "breakers": [{"pid": 1}], "alive": 1, "alive_sample": [server]},
        {"name": "reward.txt", "round": 2, "breakers": [{"pid": 1}], "alive": 1, "alive_sample": [server]})})
    profile = profile_from_run(across, ["reward.txt"])
    assert not profile.sealed and "running (python3 -m http.server) across a write" in profile.reason
    assert "could not be seen" in profile_from_run(own.model_copy(update={"rounds": []}), []).reason
    silent = own.model_copy(update={"written": [], "rounds": []})
    profile = profile_from_run(silent, ["reward.json"])
    assert profile.files == ["reward.json"] and not profile.sealed and "wrote no reward" in profile.reason
    profile = profile_from_run(silent.model_copy(update={"channel": "open", "seal_unavailable": "no python3"}), [])
    assert profile.files == ["reward.json", "reward.txt"] and "no python3" in profile.reason


def test_an_honest_solution_resolves_through_the_seal(harbor_verifier, harbor_task, gold):
    profile = harbor_verifier.harbor_grading.profile(harbor_task)
    assert profile.files == ["reward.txt"] and profile.sealed, profile
    assert profile.writers and {writer["pid"] for writer in profile.writers} == {1}  # test.sh itself
    solved = harbor_verifier.verify(harbor_task, diff=gold, actions=[])
    assert solved.kind == OutcomeKind.resolved, solved.evidence
    channel = solved.evidence["reward_channel"]
    assert channel["channel"] == "sealed" and channel["rounds"] >= 1 and channel["kills"] == 0
    assert "sealed: a write goes through only from test.sh's own process" in solved.evidence["trust_boundary"]
    # A solution whose program leaves a harmless process running: killed at test.sh's write, still resolved.
    daemon = ("diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,4 @@\n"
              "+import subprocess\n+subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
              " def add(a, b):\n-    return a - b\n+    return a + b\n")
    outcome = harbor_verifier.verify(harbor_task, diff=daemon, actions=[])
    assert outcome.kind == OutcomeKind.resolved, outcome.evidence
    assert outcome.evidence["reward_channel"]["kills"] >= 1


def test_a_reward_file_test_sh_does_not_write_is_ignored(harbor_verifier, harbor_task, tmp_path):
    outcome = harbor_verifier.verify(harbor_task, diff=REWARD_JSON, actions=[])
    assert outcome.kind == OutcomeKind.unresolved, outcome.evidence
    assert outcome.evidence["reward"] == 0.0 and outcome.evidence["reward_source"] == "reward.txt"
    assert outcome.evidence["reward_files_ignored"] == ["reward.json"]  # kept as evidence
    # Where tests/ names both files, the control run tells which one test.sh writes.
    both = _variant(harbor_task, tmp_path, "both-named", BOTH_NAMED_TESTS)
    profile = harbor_verifier.harbor_grading.profile(both)
    assert profile.named == ["reward.json", "reward.txt"] and profile.files == ["reward.txt"] and profile.sealed
    outcome = harbor_verifier.verify(both, diff=REWARD_JSON, actions=[])
    assert outcome.kind == OutcomeKind.unresolved and outcome.evidence["reward_files_ignored"] == ["reward.json"]


@pytest.mark.parametrize("attack", ["watcher", "spinner"])
def test_nothing_the_tests_leave_running_writes_after_test_sh(harbor_verifier, lingering, attack):
    outcome = harbor_verifier.verify(lingering, diff=ATTACKS[attack], actions=[])
    assert outcome.kind == OutcomeKind.unresolved, outcome.evidence
    assert outcome.evidence["check"] == "harbor_reward" and outcome.evidence["reward"] == 0.0
    channel = outcome.evidence["reward_channel"]
    assert channel["channel"] == "sealed" and channel["kills"] >= 1, channel
    if attack == "spinner":  # its opens were held until it was dead, and are on record
        assert any("open('/logs/verifier/reward.txt'" in opener["cmd"] for opener in channel["other_openers"])


def test_an_exit_hook_passing_test_sh_check_is_the_stated_boundary(harbor_verifier, harbor_task):
    # test.sh is opaque: a graded program that makes its test command exit 0 makes its check pass. Not closed for
    # a foreign test.sh; every verdict says so.
    outcome = harbor_verifier.verify(harbor_task, diff=EXIT_HOOK, actions=[])
    assert outcome.kind == OutcomeKind.resolved, outcome.evidence
    assert "1 failed" in outcome.test_log
    assert "can make test.sh's own check pass (e.g. an exit hook forcing exit 0)" in outcome.evidence["trust_boundary"]


def test_a_test_sh_writing_through_a_child_is_read_unsealed_and_says_so(harbor_verifier, harbor_task, gold,
                                                                           tmp_path):
    task = _variant(harbor_task, tmp_path, "child-writer", CHILD_WRITER_TESTS)
    profile = harbor_verifier.harbor_grading.profile(task)
    assert profile.files == ["reward.txt"] and not profile.sealed and "from a process it starts" in profile.reason
    solved = harbor_verifier.verify(task, diff=gold, actions=[])
    assert solved.kind == OutcomeKind.resolved, solved.evidence
    assert solved.evidence["reward_channel"]["channel"] == "open"
    assert "not sealed (test.sh writes reward.txt from a process it starts" in solved.evidence["trust_boundary"]
    assert harbor_verifier.verify(task, diff="", actions=[]).kind == OutcomeKind.unresolved


def test_validate_and_the_run_summary_state_the_boundary(harbor_root, harbor_task, harbor_verifier, docker_engine,
                                                         tmp_path):
    from typer.testing import CliRunner

    from lego_cli import app

    harbor_verifier.harbor_grading.profile(harbor_task)
    note = harbor_grading.harbor_trust_note([harbor_task])
    assert note.startswith("harbor: 1 task(s) graded by their own opaque tests/test.sh")
    assert "sealed after test.sh's write for 1, not sealed for 0" in note
    assert harbor_grading.harbor_trust_note([]) is None
    copy = tmp_path / "set"
    shutil.copytree(harbor_root, copy)
    result = CliRunner().invoke(app, ["tasks", "validate", "-c", "test", "--runs", "1", f"tasks.source={copy}",
                                      f"project.work_dir={tmp_path / 'work'}", f"docker.host={docker_engine.base_url}"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "add-numbers: opaque test.sh: the graded code runs as test.sh's user and can make test.sh's own check " \
           "pass" in text
    assert "Lego reads only reward.txt, sealed" in text
