import pytest

from textkit import shorten, truncate


def test_fits_unchanged():
    assert truncate("short", 10) == "short"
    assert truncate("exactly10!", 10) == "exactly10!"


def test_break_words():
    assert truncate("Hello wonderful world", 10) == "Hello w..."


def test_between_words():
    assert truncate("The quick brown fox", 12, break_words=False) == "The quick..."


def test_long_single_word():
    assert truncate("Supercalifragilistic", 10, break_words=False) == "Superca..."


def test_custom_placeholder():
    assert truncate("abcdefghij", 5, placeholder="~") == "abcd~"


def test_width_smaller_than_placeholder():
    with pytest.raises(ValueError):
        truncate("abc", 2)


def test_shorten_collapses_whitespace():
    assert shorten("a   b\n\tc", 10) == "a b c"
