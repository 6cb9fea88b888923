"""The proxy's cost per call: only what is new is rendered and tokenized, and it is exactly what full rendering and
the tokenizer give.

With the real Qwen3 tokenizer and template: skeleton renders against full renders on random conversations, the
probe turning skeletons off for a template they cannot stand in for, the first turn's tokens kept per process, the
word-cache tokenizer against the tokenizer on random ASCII, and tool-list keys by value.
"""

from __future__ import annotations

import copy
import json
import lzma
import random
from pathlib import Path

import httpx
import pytest
from proxy_doubles import BackgroundProxy, ScriptedEngine, assistant_text, check_fidelity

from lego.proxy.encoder import WordCacheEncoder
from lego.proxy.messages import ChatMessage, Conversation, ToolCall, tools_key
from lego.proxy.render import ChatRenderer

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a command",
                                           "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}},
         {"type": "function", "function": {"name": "read", "description": "Read a file",
                                           "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]
CONTENTS = ["ok", "", "  spaced  ", "\n\nlines\n\n", "<tool_response>\nwrapped\n</tool_response>", "é 中文 🦜",
            "{{ not jinja }} {% raw %}", "</think> <think>", "a" * 300, "<|im_end|>", "tab\tand\r\nCRLF"]


@pytest.fixture(scope="module")
def renderers(tokenizer):
    return ChatRenderer(tokenizer), ChatRenderer(tokenizer, incremental=False)


def random_conversation(rng: random.Random) -> tuple[Conversation, int]:
    messages = [ChatMessage("system", rng.choice(CONTENTS) or "sys")] if rng.random() < 0.8 else []
    messages.append(ChatMessage("user", rng.choice(CONTENTS)))
    for _ in range(rng.randint(0, 5)):
        calls = [ToolCall("bash", json.dumps({"command": rng.choice(CONTENTS)}))] * rng.randint(0, 2)
        messages.append(ChatMessage("assistant", rng.choice(CONTENTS), calls,
                                    reasoning=rng.choice([None, "", "thought"])))
        for _ in range(rng.randint(0, 3)):
            role = rng.choice(["tool", "tool", "user", "system"])
            messages.append(ChatMessage(role, rng.choice(CONTENTS), tool_call_id="c" if role == "tool" else ""))
    known = rng.randint(1, len(messages) - 1) if len(messages) > 1 else 1
    return Conversation(messages, TOOLS if rng.random() < 0.7 else []), known


def test_the_qwen3_template_renders_from_skeletons(renderers):
    fast, full = renderers
    assert fast.incremental and not full.incremental


def test_skeletons_render_what_the_full_template_renders(renderers):
    fast, full = renderers
    rng = random.Random(3)
    rendered_from_skeletons = 0
    for _ in range(600):
        conversation, known = random_conversation(rng)
        expected = full.new_text(conversation, known)
        assert fast.new_text(conversation, known) == expected, [m.role for m in conversation.messages]
        new = conversation.messages[known:]
        rendered_from_skeletons += all(m.role in ("user", "tool", "system") for m in new) and len(new) > 0
    assert rendered_from_skeletons > 100  # the fast path was the one compared, not only the fallback


def test_a_template_skeletons_cannot_stand_in_for_is_rendered_whole(tokenizer):
    numbered = copy.copy(tokenizer)  # the same tokenizer, its tool results numbered by their place
    numbered.chat_template = tokenizer.chat_template.replace(
        "{{- '\\n<tool_response>\\n' }}", "{{- '\\n<tool_response>' + loop.index|string + '\\n' }}")
    assert numbered.chat_template != tokenizer.chat_template
    renderer = ChatRenderer(numbered)
    assert not renderer.incremental
    conversation = Conversation([ChatMessage("system", "s"), ChatMessage("user", "u"),
                                 ChatMessage("assistant", "a", [ToolCall("bash", "{}")]),
                                 ChatMessage("tool", "out", tool_call_id="c")], [])
    assert "<tool_response>4\nout" in renderer.new_text(conversation, 3)


def test_a_sessions_first_turn_is_tokenized_once_per_process(tokenizer):
    engine = ScriptedEngine(tokenizer)
    background = BackgroundProxy(engine, tokenizer)
    renderer = background.server.renderer
    encoded: list[int] = []
    encode = renderer.encode

    def counting(text: str) -> list[int]:
        encoded.append(len(text))
        return encode(text)

    renderer.encode = counting
    try:
        system = "You are a careful coding agent. " * 400  # a harness's long system prompt
        body = {"model": "m", "tools": TOOLS, "messages": [{"role": "system", "content": system},
                                                           {"role": "user", "content": "Fix calc.py"}]}
        engine.script(assistant_text("Looking.", [("bash", {"command": "ls"})]),
                      assistant_text("Looking.", [("bash", {"command": "ls"})]))
        first, second = background.open_session(), background.open_session()
        for session in (first, second):
            encoded.clear()
            response = httpx.post(f"{session.openai_base_url}/chat/completions", json=body, timeout=60)
            assert response.status_code == 200, response.text
            if session is first:
                assert max(encoded) > len(system)  # the first session tokenized the system turn
            else:
                assert sum(encoded) < 200  # the second one only its user turn: the system turn was kept
        full = tokenizer.apply_chat_template(body["messages"], tools=TOOLS, add_generation_prompt=True,
                                             tokenize=True, return_dict=True)["input_ids"]
        assert engine.prompts[0] == engine.prompts[1] == list(full)
        for session in (first, second):
            view = ScriptedEngine(tokenizer)
            index = 0 if session is first else 1
            view.prompts, view.results = [engine.prompts[index]], [engine.results[index]]
            check_fidelity(session, view)
    finally:
        background.close()


def test_the_word_cache_tokenizes_as_the_tokenizer(tokenizer):
    fast = tokenizer._tokenizer
    encoder = WordCacheEncoder.for_tokenizer(fast)
    assert encoder is not None
    rng = random.Random(11)
    alphabet = [chr(code) for code in range(128)] + [" "] * 30 + ["\n"] * 10 + [
        "'s", "'LL", "<|im_end|>", "<tool_call>", "</tool_response>", "<think>", "  ", "\r\n", "123", "x_y"]
    for _ in range(4000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 120)))
        assert encoder.encode(text) == fast.encode(text, add_special_tokens=False).ids, repr(text)
    assert encoder.encode("naïve") is None  # not ASCII: the tokenizer's own
    code = open(__file__).read()
    assert list(ChatRenderer(tokenizer).encode(code)) == fast.encode(code, add_special_tokens=False).ids


def test_long_texts_cut_into_units_tokenize_as_the_tokenizer(tokenizer):
    """Texts long enough to be cut into units at spaces (lego/proxy/encoder.py), with every kind of whitespace next
    to the cuts (runs of spaces, indentation after newlines and tabs, spaces at the start and the end), each
    tokenized with nothing cached, then again with its units cached, then as part of other texts."""
    fast = tokenizer._tokenizer
    encoder = WordCacheEncoder.for_tokenizer(fast)
    rng = random.Random(17)
    pieces = ["x", "foo", "Bar9", "'s", "1", "42", ".", "()", ":", "=", "-", "\t", "\n", "\r\n", "\x0b", "\x0c",
              "\x00", "\x01", "\x1f", "<|im_end|>", " ", " ", " ", "  ", "   ", "\n    ", "\n\n  ", "\t ", " \t", "\n \n"]
    texts = []
    for _ in range(600):
        text = "".join(rng.choice(pieces) + rng.choice(["", " "]) for _ in range(rng.randint(10, 400)))
        texts.append(text)
    texts += [" " + texts[0], "   " + texts[1], texts[2] + "  ", "\n  " + texts[3]]
    encoder.clear()
    for text in texts:
        expected = fast.encode(text, add_special_tokens=False).ids
        assert encoder.encode(text) == expected, repr(text)  # first sight: units tokenized
        assert encoder.encode(text) == expected, repr(text)  # every unit cached
        assert list(encoder.encode_array(text)) == expected
    for first, second in zip(texts, texts[1:], strict=False):
        joined = first + second
        assert encoder.encode(joined) == fast.encode(joined, add_special_tokens=False).ids, repr(joined)


def test_long_units_and_words_are_tokenized_each_time_not_kept(tokenizer):
    """A text without spaces (a base64 blob, minified JSON) is one unit: it is tokenized exactly, every time, and
    not kept, so the caches' memory does not grow with how long the texts are."""
    from lego.proxy.encoder import CACHED_CHARS

    fast = tokenizer._tokenizer
    encoder = WordCacheEncoder.for_tokenizer(fast)
    rng = random.Random(23)
    blobs = ["".join(rng.choice("ABCDEFabcdef0123456789+/=") for _ in range(2000)),
             "x" * 3000, '{"a":[1,2,3],"b":{"c":"' + "d" * 500 + '"}}' * 20]
    for blob in blobs:
        text = "result: " + blob + " done\n" + blob
        for _ in range(2):
            assert encoder.encode(text) == fast.encode(text, add_special_tokens=False).ids
    kept = [*encoder._units, *encoder._cache]
    assert kept and max(map(len, kept)) <= min(CACHED_CHARS, 1000)  # every blob's units are 2,000+ characters


def test_the_word_cache_refuses_a_tokenizer_it_cannot_match():
    from tokenizers import Tokenizer, models, pre_tokenizers

    other = Tokenizer(models.BPE(vocab={"a": 0, "b": 1, "ab": 2}, merges=[("a", "b")]))
    other.pre_tokenizer = pre_tokenizers.Whitespace()
    assert WordCacheEncoder.for_tokenizer(other) is None


def test_tool_lists_are_keyed_by_value():
    tools = copy.deepcopy(TOOLS)
    key = tools_key(tools)
    assert tools_key(copy.deepcopy(TOOLS)) == key
    tools[0]["function"]["description"] = "Run a command, changed"
    assert tools_key(tools) != key  # the kept copy did not change with the caller's list
    assert tools_key(copy.deepcopy(TOOLS)) == key


# ------------------------------------------------------------------------------------------ tokenizer fast paths

THREAD_FIXTURES = Path(__file__).parent / "fixtures" / "threads"
ADVERSARIAL = [
    "", " ", "  ", "\n", "\n\n\n", " \n \n", "\t\t x", "   leading", "trailing   ", "a  b   c    d", "\r\n\r\n  \r\n",
    "It's they're we'LL I'M you've he'd 'S 's' x's don't", "''s '' 's's", "12345 1,000,000 3.14159 0x1F 1e-9 v2.0.1",
    "x1y2z3 __init__ a_b_c", "naïve café 中文 🙂 émoji\u00a0nbsp", "tab\tsep\tvalues\n", "\x00\x01\x1f\x7f control",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "<tool_response>\n  ok\n</tool_response>",
    "def f(x):\n    return x ** 2  # comment\n\n\n", "\u2028\u2029 line separators", "a" * 500, " " * 100 + "x",
]


def captured_texts(renderer: ChatRenderer) -> list[str]:
    """Every captured harness request's rendered prompt and the texts in it (tests/fixtures/threads)."""
    from lego.proxy import anthropic, openai_chat, responses

    routes = {"/v1/messages": anthropic, "/v1/chat/completions": openai_chat, "/v1/responses": responses}
    texts: list[str] = []
    for path in sorted(THREAD_FIXTURES.glob("*.json.xz")):
        with lzma.open(path, "rt", encoding="utf-8") as handle:
            calls = json.load(handle)["calls"]
        for call in calls:
            conversation, _ = routes[call["path"].split("?")[0]].parse_request(call["body"])
            texts.append(renderer.render(conversation.template_messages(), conversation.tools,
                                         add_generation_prompt=True))
            texts.extend(message.content for message in conversation.messages)
            texts.append(call.get("reply") or "")
    return texts


def test_the_word_cache_tokenizes_captured_harness_requests_as_the_tokenizer(tokenizer):
    """The fast path (units and words cached, unseen words through the BPE model alone) against the tokenizer
    itself, on what real harnesses sent, each text both with nothing cached and with its words cached, and on
    adversarial text."""
    fast = tokenizer._tokenizer
    renderer = ChatRenderer(tokenizer)
    texts = captured_texts(renderer) + ADVERSARIAL
    assert len(texts) > 100
    for warm in (False, True):
        encoder = WordCacheEncoder.for_tokenizer(fast)
        assert encoder is not None and encoder._bpe is not None  # unseen words through the model alone
        for text in texts:
            if not warm:
                encoder.clear()
            expected = fast.encode(text, add_special_tokens=False).ids
            got = encoder.encode(text)
            assert got is None if not text.isascii() else got == expected, repr(text[:200])
            assert list(renderer.encode(text)) == expected, repr(text[:200])


def test_unseen_words_through_the_model_alone_are_tokenized_as_by_the_tokenizer(tokenizer):
    encoder = WordCacheEncoder.for_tokenizer(tokenizer._tokenizer)
    assert encoder._bpe is not None
    rng = random.Random(5)
    alphabet = [chr(code) for code in range(128)]
    for _ in range(300):
        words = list(dict.fromkeys("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12)))
                                   for _ in range(rng.randint(2, 30))))
        one_by_one = [encoder._model.encode(word, add_special_tokens=False).ids for word in words]
        assert encoder._encode_words(words) == one_by_one, words


def test_replies_decode_as_the_tokenizer_decodes_them(tokenizer):
    """A reply whose tokens are all ASCII is decoded from a table of token texts; any other through the tokenizer.
    Both read as the tokenizer's own decode, for ASCII, non-ASCII, unfinished characters and special tokens."""
    renderer = ChatRenderer(tokenizer)
    fast = tokenizer._tokenizer
    specials = [tokenizer.convert_tokens_to_ids(token) for token in ("<|im_end|>", "<tool_call>", "<think>")]
    rng = random.Random(7)
    samples = [tokenizer.encode(text, add_special_tokens=False) for text in ADVERSARIAL + ["é", "中文 ok", "🙂"]]
    ascii_ids = [token for ids in samples for token in ids if fast.decode([token]).isascii()]
    for _ in range(400):
        pool = rng.choice([ascii_ids, ascii_ids + specials, list(range(151643)) + specials])
        samples.append([rng.choice(pool) for _ in range(rng.randint(0, 40))])
    for ids in samples * 2:  # the second time from the table
        assert renderer.decode(ids) == fast.decode(ids, skip_special_tokens=False), ids
        for cut in (1, 2, 3):
            assert renderer.decode(ids[:-cut]) == fast.decode(ids[:-cut], skip_special_tokens=False), ids


def test_a_reply_decoded_once_reads_as_decoded_whole(tokenizer):
    """The end-of-turn token's text is added to the decoded reply instead of decoding the reply again."""
    renderer = ChatRenderer(tokenizer)
    assert renderer.decodes_by_concatenation
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    rng = random.Random(3)
    texts = ADVERSARIAL + ["é", "中文", "🙂🙂"]
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False)
        for cut in range(len(ids) + 1):  # every prefix, unfinished characters included
            shown = ids[:cut]
            assert renderer.decode_after(renderer.decode(shown), shown, [*shown, end]) == \
                renderer.decode([*shown, end]), (text, cut)
    for _ in range(300):
        shown = [rng.randrange(151643) for _ in range(rng.randint(0, 8))]
        assert renderer.decode_after(renderer.decode(shown), shown, [*shown, end]) == renderer.decode([*shown, end])


def _candidates_by_full_sort(branches, keys):
    """The order `_candidates` must give: every checkpoint within each branch's shared run of keys, sorted."""
    from lego.proxy.session import Checkpoint, common_prefix

    found = []
    for order, branch in enumerate(branches):
        known = common_prefix(keys, branch.keys)
        found += [(c.messages, order, branch, c) for c in branch.checkpoints if 0 < c.messages <= known]
    found.sort(key=lambda c: (c[0], c[1]), reverse=True)
    return [(branch, checkpoint) for _, _, branch, checkpoint in found] + [(None, Checkpoint(0, 0))]


def test_start_candidates_come_best_first_as_a_full_sort_orders_them():
    """A request's starting points are tried best first without listing every checkpoint of a long rollout; the
    order is the full sort's, on branches as sessions build them (non-decreasing message counts, repeats, forks
    sharing a prefix of keys, keys that differ anywhere)."""
    import random

    from lego.proxy.session import Branch, Checkpoint, SegmentReason, Thread, _candidates, common_prefix

    rng = random.Random(7)
    thread = Thread("sig", 0, True)
    for _ in range(400):
        keys = [f"k{rng.randrange(3)}" for _ in range(rng.randrange(0, 40))]
        branches = []
        for _ in range(rng.randrange(0, 5)):
            branch = Branch(thread, SegmentReason.start)
            cut = rng.randrange(0, len(keys) + 1)
            branch.keys = keys[:cut] + [f"x{rng.randrange(2)}" for _ in range(rng.randrange(0, 6))]
            messages = 0
            for _ in range(rng.randrange(0, 30)):
                messages += rng.choice((0, 0, 1, 1, 2))
                branch.checkpoints.append(Checkpoint(messages, messages * 10))
            branches.append(branch)
        got = [(branch, checkpoint) for branch, checkpoint in _candidates(branches, keys)]
        want = _candidates_by_full_sort(branches, keys)
        assert [(id(b), id(c)) for b, c in got[:-1]] == [(id(b), id(c)) for b, c in want[:-1]]
        assert got[-1][0] is None and got[-1][1] == Checkpoint(0, 0)
        for branch in branches:  # the C-level shortcut agrees with a walk over both lists
            walked = next((i for i, (x, y) in enumerate(zip(keys, branch.keys, strict=False)) if x != y),
                          min(len(keys), len(branch.keys)))
            assert common_prefix(keys, branch.keys) == walked
