"""Message match keys (lego/proxy/messages.py `MessageKey`): equal exactly when the messages' roles are equal, their
texts are equal up to whitespace and their tool calls are equal by value, however the texts differ."""

from __future__ import annotations

import random

from lego.proxy.messages import ChatMessage, MessageKey, ToolCall, normalize_text

WHITESPACE = [" ", "  ", "\n", "\t", "\r\n", " \n  ", "\x0b", "\x0c", "\u00a0", "\u2003", "\x1c"]


def _respaced(rng: random.Random, words: list[str]) -> str:
    return (rng.choice(["", *WHITESPACE]) + "".join(w + rng.choice(WHITESPACE) for w in words[:-1]) + words[-1]
            + rng.choice(["", *WHITESPACE]))


def test_keys_are_equal_exactly_when_the_normalized_texts_are():
    rng = random.Random(7)
    vocabulary = ["ls", "a", "b", "def", "f(x):", "return", "é", "x\u200by", "{}", "''"]
    for _ in range(2000):
        words = [rng.choice(vocabulary) for _ in range(rng.randint(1, 6))]
        other = list(words) if rng.random() < 0.5 else [rng.choice(vocabulary) for _ in words]
        a, b = _respaced(rng, words), _respaced(rng, other)
        role = rng.choice(["user", "tool"])
        key_a, key_b = MessageKey(role, a), MessageKey(role if rng.random() < 0.8 else "assistant", b)
        expected = key_a.role == key_b.role and normalize_text(a) == normalize_text(b)
        assert (key_a == key_b) is expected and (key_a != key_b) is (not expected), (a, b)
        if expected:
            assert hash(key_a) == hash(key_b) and len({key_a, key_b}) == 1


def test_tool_calls_compare_by_name_and_arguments_by_value():
    def key(*calls: tuple[str, str], content: str = "I'll look.") -> MessageKey:
        return ChatMessage("assistant", content, [ToolCall(name, arguments, id=f"call_{i}")
                                                 for i, (name, arguments) in enumerate(calls)]).key()

    spaced = key(("bash", '{"command": "ls", "n": 2}'))
    assert spaced == key(("bash", '{"n":2,"command":"ls"}')) == key(("bash", '{\n "command" : "ls", "n": 2}'))
    assert spaced != key(("bash", '{"command": "ls", "n": 3}'))
    assert spaced != key(("sh", '{"command": "ls", "n": 2}'))
    assert spaced != key(("bash", '{"command": "ls", "n": 2}'), ("bash", '{"command": "ls", "n": 2}'))
    assert spaced != key(content="I'll look.")
    assert key(("bash", "not json  at all")) == key(("bash", "not json at all"))


def test_equal_texts_settle_equality_without_normalizing():
    """The usual case, a resent message, is decided on the texts (the digest is what costs)."""
    text = "collected 3 items\n\ntest_calc.py ...   [100%]\n" * 20
    first, second = ChatMessage("tool", text).key(), ChatMessage("tool", "".join(list(text))).key()
    assert first == second
    assert first._digest is None and second._digest is None
    assert first != ChatMessage("tool", text + "x").key()
    assert first._digest is not None
