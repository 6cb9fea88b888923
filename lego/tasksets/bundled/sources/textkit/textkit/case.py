"""Converting between naming styles."""

from __future__ import annotations

from textkit.words import split_words


def to_snake(text: str) -> str:
    return "_".join(word.lower() for word in split_words(text))


def to_kebab(text: str) -> str:
    return "-".join(word.lower() for word in split_words(text))


def to_camel(text: str) -> str:
    words = split_words(text)
    if not words:
        return ""
    return words[0].lower() + "".join(word.capitalize() for word in words[1:])


def to_pascal(text: str) -> str:
    return "".join(word.capitalize() for word in split_words(text))


def to_title(text: str) -> str:
    return " ".join(word.capitalize() for word in split_words(text))


def to_constant(text: str) -> str:
    return "_".join(word.upper() for word in split_words(text))
