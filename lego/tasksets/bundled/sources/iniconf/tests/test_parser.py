import pytest

from iniconf import ParseError, parse

SAMPLE = """
# a comment
[server]
host = example.org
Port: 8080

; another comment
[paths]
root = /srv/app
"""


def test_sections_and_options():
    assert parse(SAMPLE) == {"server": {"host": "example.org", "port": "8080"}, "paths": {"root": "/srv/app"}}


def test_keys_are_lowercased():
    assert parse("[a]\nMixedCase = 1\n") == {"a": {"mixedcase": "1"}}


def test_empty_value():
    assert parse("[a]\nempty =\n") == {"a": {"empty": ""}}


def test_multiline_value():
    text = "[a]\nitems = one\n    two\n    three\nnext = x\n"
    assert parse(text)["a"] == {"items": "one\ntwo\nthree", "next": "x"}


def test_blank_line_ends_multiline_value():
    with pytest.raises(ParseError):
        parse("[a]\nitems = one\n\n  two\n")


def test_inline_comment():
    assert parse("[a]\nname = value ; explained here\nother = v # too\n")["a"] == {"name": "value", "other": "v"}


def test_quoted_value_is_literal():
    assert parse('[a]\nmsg = "  keep ; this # too "\n')["a"]["msg"] == "  keep ; this # too "


def test_option_before_section():
    with pytest.raises(ParseError, match="line 1: option 'key' appears before any"):
        parse("key = value\n[a]\n")


def test_duplicates_rejected():
    with pytest.raises(ParseError, match="duplicate section"):
        parse("[a]\n[a]\n")
    with pytest.raises(ParseError, match="line 3: duplicate option 'x'"):
        parse("[a]\nx = 1\nX = 2\n")


def test_garbage_line():
    with pytest.raises(ParseError, match="line 2"):
        parse("[a]\nthis is not an option\n")
