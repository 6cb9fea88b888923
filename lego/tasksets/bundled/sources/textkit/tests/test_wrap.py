import pytest

from textkit import fill, indent, wrap


def test_wrap_basic():
    assert wrap("the quick brown fox jumps", 10) == ["the quick", "brown fox", "jumps"]


def test_wrap_exact_width():
    assert wrap("aaa bbb", 7) == ["aaa bbb"]


def test_long_word_alone():
    assert wrap("a verylongword b", 5) == ["a", "verylongword", "b"]


def test_initial_indent():
    assert wrap("aaa bbb ccc", 9, initial_indent="  ") == ["  aaa bbb", "ccc"]


def test_fill_paragraphs():
    assert fill("one two three\n\nfour", 7) == "one two\nthree\n\nfour"


def test_indent():
    assert indent("a\n\nb\n", "> ") == "> a\n\n> b\n"


def test_bad_width():
    with pytest.raises(ValueError):
        wrap("x", 0)
