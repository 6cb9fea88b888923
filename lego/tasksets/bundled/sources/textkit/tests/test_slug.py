import pytest

from textkit import slugify, unique_slug


def test_basic():
    assert slugify("Hello World") == "hello-world"


def test_accents_removed():
    assert slugify("Crème brûlée recipe") == "creme-brulee-recipe"


def test_leading_punctuation():
    assert slugify("  ...Leading dots") == "leading-dots"


def test_custom_separator():
    assert slugify("Snake case please", separator="_") == "snake_case_please"


def test_bad_separator():
    with pytest.raises(ValueError):
        slugify("x", separator="a")


def test_max_length_cuts_between_words():
    assert slugify("the quick brown fox", max_length=12) == "the-quick"


def test_unique_slug():
    assert unique_slug("Post", {"post", "post-2"}) == "post-3"
    assert unique_slug("New", {"post"}) == "new"
