"""`lego bench proxy` runs as a deployment would (client, upstream, pass-through and proxy in processes of their own)
and reports the proxy beside the pass-through, on a small load."""

from __future__ import annotations

import json
import shutil

import pytest

from lego.bench.proxy import Conversation, canned_answers, make_shapes, run_bench


def test_the_shapes_are_the_harnesses_sizes(tokenizer):
    from lego.proxy import anthropic, openai_chat

    shapes = make_shapes()
    for name, (tokens, kilobytes) in {"mini_swe_agent": (2086, 8), "claude_code": (16408, 80)}.items():
        shape = shapes[name]
        body = Conversation(shape, "", False).request()[1]
        module = openai_chat if shape.protocol == "openai_chat" else anthropic
        conversation, _ = module.parse_request(json.loads(body))
        count = len(tokenizer.apply_chat_template(conversation.template_messages(), tools=conversation.tools,
                                                  add_generation_prompt=True, tokenize=True,
                                                  return_dict=True)["input_ids"])
        assert abs(count - tokens) / tokens < 0.05 and abs(len(body) / 1024 - kilobytes) / kilobytes < 0.1
        whole, events = canned_answers(shape)
        assert json.loads(whole) and len(events) > 5  # the upstream streams a few tokens per event


def test_the_bench_reports_the_proxy_beside_the_pass_through():
    result = run_bench(sessions=2, turns=2, rounds=1)
    assert set(result["results"]) == {"mini_swe_agent", "claude_code"}
    for shape in result["results"].values():
        for mode in ("non_stream", "stream"):
            for phase in ("first_turn", "later_turns"):
                row = shape[mode][phase]
                assert row["proxy"]["cpu_ms_per_call"] > 0 and row["passthrough"]["cpu_ms_per_call"] > 0
                # one round: its ratio is the two CPU figures' (those are reported rounded to the microsecond)
                assert row["ratio"]["cpu_per_call"] == pytest.approx(
                    row["proxy"]["cpu_ms_per_call"] / row["passthrough"]["cpu_ms_per_call"], abs=0.02)
                assert row["direct"]["p50_ms"] > 0 and "added_p50" in row["ratio"]
    assert isinstance(result["target"]["later_turns_met"], bool)


@pytest.mark.skipif(shutil.which("valgrind") is None or shutil.which("callgrind_control") is None,
                    reason="valgrind is not installed (scripts/setup.sh installs it)")
def test_the_bench_counts_instructions_under_callgrind(tmp_path):
    """measure=instructions: the pass-through and the proxy run under callgrind, each phase's
    instructions per call are reported with their ratio, and each phase's profile is kept when asked."""
    result = run_bench(sessions=2, turns=2, rounds=1, shape_names=("mini_swe_agent",), modes=(False,),
                       measure="instructions", profiles=tmp_path)
    assert result["measure"] == "instructions"
    for phase in ("first_turn", "later_turns"):
        row = result["results"]["mini_swe_agent"]["non_stream"][phase]
        proxy, passthrough = row["proxy"]["instructions_per_call"], row["passthrough"]["instructions_per_call"]
        # a call through either costs at least a hundred thousand instructions (an HTTP request served in Python)
        assert proxy > 100_000 and passthrough > 100_000
        assert row["ratio"]["instructions_per_call"] == pytest.approx(proxy / passthrough, abs=0.002)
        for target in ("proxy", "passthrough"):
            profile = tmp_path / f"{target}-mini_swe_agent-non_stream-{phase}.callgrind"
            assert any(line.startswith("totals:") for line in profile.read_text().splitlines())
    assert isinstance(result["target"]["later_turns_met"], bool)


def test_an_unknown_measure_is_refused_with_the_choices(monkeypatch):
    from lego.bench.proxy import BenchError, bench_proxy

    with pytest.raises(BenchError, match="cpu, instructions"):
        bench_proxy(None, None, measure="wall")


def test_counting_instructions_without_valgrind_says_how_to_get_it(monkeypatch, tmp_path):
    from lego.bench.proxy import BenchError, InstructionMeter

    monkeypatch.setenv("PATH", str(tmp_path))  # no valgrind on it
    with pytest.raises(BenchError, match="apt-get install valgrind"):
        InstructionMeter(tmp_path)


def test_a_benchmarks_options_come_from_its_parameters():
    from lego.bench import benchmark_options
    from lego.bench.proxy import bench_proxy
    from lego.errors import LegoError

    assert benchmark_options("proxy", bench_proxy, {"sessions": "8", "measure": "instructions"}) == {
        "sessions": 8, "measure": "instructions"}
    with pytest.raises(LegoError, match="no option session; it takes sessions, turns"):
        benchmark_options("proxy", bench_proxy, {"session": "8"})
    with pytest.raises(LegoError, match="turns='two' is not a whole number"):
        benchmark_options("proxy", bench_proxy, {"turns": "two"})
