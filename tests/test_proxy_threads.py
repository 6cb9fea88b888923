"""Threads on captured harness runs: every call's thread (main or sub-agent) and kind, replayed through the proxy.

The fixtures under tests/fixtures/threads/ are real request sequences: each harness, as Lego launches it, ran
offline against the real proxy with a scripted engine (tests/fixtures/threads/capture.py tells how, and how to
capture them again). Each recorded call holds the request body as the harness sent it, the reply the engine gave
(replayed here token for token, so the harness's later requests hold exactly the replies they held then) and the
agent that sent it (`actor`: main, compaction, subagent or title), which the proxy's classification must match:
- Claude Code 2.1.197: an Agent-tool sub-agent (its own system prompt) and an auto-compaction (the summary request
  extends the main history; the compacted conversation carries another `cc_version` fingerprint in its system
  header and none of the old messages).
- OpenCode 1.18.33: the title request, and a `task` sub-agent with the main system prompt and 8 of its 10 tools.
- Codex 0.171.0: two `spawn_agent` sub-agents with the main instructions and fewer tools, one with `fork_context`
  (it replays the main agent's user messages).
- mini-swe-agent 2.4.6: a reply without a tool call, left out of the history (a rewrite).
- OpenHands SDK 1.58.2: plain tool turns.
"""

from __future__ import annotations

import copy
import json
import lzma
from pathlib import Path

import httpx
import pytest
from proxy_doubles import ScriptedEngine, background_proxy, check_fidelity

FIXTURES = Path(__file__).parent / "fixtures" / "threads"
MAIN = {"main", "compaction"}  # actors whose calls belong to the main thread

# Per call: the main thread's kind, or "sub" for a call outside the main thread.
EXPECTED = {
    "claude-code": ["start", "extend", "rewrite", "rewrite", "sub", "sub", "extend", "extend"],
    "opencode": ["sub", "start", "sub", "sub", "extend", "extend"],
    "codex": ["start", "extend", "sub", "sub", "extend", "extend", "sub", "sub", "extend", "extend"],
    "mini-swe-agent": ["start", "extend", "rewrite", "extend"],
    "openhands": ["start", "extend", "extend"],
}

# The calls of each sub-agent conversation (the title request is one of its own).
SUBAGENT_CONVERSATIONS = {"claude-code": [[4, 5]], "opencode": [[0], [2, 3]], "codex": [[2, 3], [6, 7]]}


def load(name: str) -> dict:
    with lzma.open(FIXTURES / f"{name}.json.xz", "rt", encoding="utf-8") as handle:
        return json.load(handle)


@pytest.fixture()
def proxy(tokenizer):
    with background_proxy(ScriptedEngine(tokenizer), tokenizer, 512) as background:
        yield background


def replay(proxy, calls: list[dict]):
    session = proxy.open_session()
    for number, call in enumerate(calls):
        proxy.engine.script(call["reply"])
        response = httpx.post(f"{session.base_url}{call['path']}", json=call["body"], timeout=120)
        assert response.status_code == 200, f"call {number}: {response.text}"
    return session


def labels(calls) -> list[str]:
    return ["sub" if call.kind == "subagent" else call.kind for call in calls]


@pytest.mark.parametrize("harness", sorted(EXPECTED))
def test_captured_threads(proxy, harness):
    record = load(harness)
    assert [call["actor"] in MAIN for call in record["calls"]] == [kind != "sub" for kind in EXPECTED[harness]]
    session = replay(proxy, record["calls"])
    segments, calls = check_fidelity(session, proxy.engine)
    assert labels(calls) == EXPECTED[harness]
    # What verl's agent loop trains, the last main segment, is the one the main agent's last call sampled in.
    main = [index for index, segment in enumerate(segments) if segment.thread == "main"]
    last = [call for call in calls if call.kind != "subagent"][-1]
    assert last.segment_index == main[-1]
    for call in calls:
        assert (segments[call.segment_index].thread == "main") == (call.kind != "subagent")
    # Each sub-agent conversation is one segment of its own: its first call starts it, later ones extend it.
    groups: dict[int, list[int]] = {}
    for number, call in enumerate(calls):
        if call.kind == "subagent":
            assert segments[call.segment_index].reason == "subagent"
            groups.setdefault(call.segment_index, []).append(number)
    assert sorted(groups.values()) == SUBAGENT_CONVERSATIONS.get(harness, [])


def test_claude_code_compaction_stays_main(proxy):
    """The compacted conversation's system header differs (cc_version's fingerprint) and it shares no message with
    the old one: a main-thread rewrite from scratch, whose segment is the last main one."""
    calls = load("claude-code")["calls"]
    headers = [call["body"]["system"][0]["text"] for call in calls]
    assert headers[3] != headers[0] and "cc_version=" in headers[3]  # the capture shows the volatile header
    session = replay(proxy, calls)
    segments, records = session.trajectory_parts()
    main = [segment for segment in segments if segment.thread == "main"]
    assert [segment.reason for segment in main] == ["start", "rewrite", "rewrite"]
    # the summary request forked the main history; the compacted conversation starts from nothing it had
    summary, compacted = records[2], records[3]
    assert summary.prompt_tokens - summary.new_prompt_tokens > records[0].prompt_tokens
    assert compacted.new_prompt_tokens == compacted.prompt_tokens
    assert sum(1 for call in records if call.kind != "subagent") == 6  # main_calls: the sub-agent's two left out


def test_codex_forked_subagent_is_not_main(proxy):
    """A `fork_context` sub-agent replays the main agent's user messages, never its sampled replies."""
    calls = load("codex")["calls"]
    assert '"fork_context": true' in calls[4]["reply"]  # the main agent's second spawn_agent
    assert calls[0]["body"]["input"][3] in calls[6]["body"]["input"]  # the main task, replayed to the fork
    session = replay(proxy, calls)
    segments, records = session.trajectory_parts()
    subagents = {segments[records[number].segment_index].thread for number in (2, 3, 6, 7)}
    assert len(subagents) == 1 and subagents != {"main"}  # both have the same signature: one sub-agent thread
    assert len({records[number].segment_index for number in (2, 6)}) == 2  # two conversations, two segments


def test_changed_tools_mid_conversation_stay_main(proxy):
    """Constructed from the OpenCode capture: the main agent's tool list loses `todowrite` mid-conversation (as when
    a harness withdraws a tool). The request holds the main branch whole, sampled replies included: the same thread,
    a rewrite (its prompt renders differently from the start), then extended. The `task` sub-agent, which also lacks
    `todowrite` and holds none of the main agent's replies, stays a sub-agent; so does a side call without tools
    that replays the whole main conversation under another system prompt (a summary)."""
    calls = copy.deepcopy(load("opencode")["calls"])
    for changed in calls[4:]:
        changed["body"]["tools"] = [tool for tool in changed["body"]["tools"]
                                    if tool["function"]["name"] != "todowrite"]
    summary = copy.deepcopy(calls[5])
    summary["body"]["messages"][0] = {"role": "system", "content": "You summarise conversations."}
    summary["body"].pop("tools"), summary["body"].pop("tool_choice")
    summary["reply"] = "The agent fixed calc.add."
    session = replay(proxy, [calls[0], calls[1], calls[4], calls[2], calls[3], summary, calls[5]])
    segments, records = session.trajectory_parts()
    assert labels(records) == ["sub", "start", "rewrite", "sub", "sub", "sub", "extend"]
    main = [index for index, segment in enumerate(segments) if segment.thread == "main"]
    assert records[-1].segment_index == main[-1]
