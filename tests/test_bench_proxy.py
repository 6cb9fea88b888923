"""`lego bench proxy` runs as a deployment would (client, upstream, pass-through and proxy in processes of their own)
and reports the proxy beside the pass-through, on a small load."""

from __future__ import annotations

import json

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
