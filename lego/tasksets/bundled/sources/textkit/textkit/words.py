"""Splitting identifiers and phrases into words: "parseHttpRequest" -> parse, Http, Request."""

from __future__ import annotations

import re

_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]|\d+")


def split_words(text: str) -> list[str]:
    """Words of ``text`` whatever its style (spaces, snake_case, kebab-case, camelCase, PascalCase)."""
    return _WORD.findall(text)
