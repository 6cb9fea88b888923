"""Parsing INI text into sections of raw string values.

- ``[section]`` headers; options as ``key = value`` or ``key: value`` (keys are case-insensitive);
- whole-line comments start with ``#`` or ``;``; an inline comment starts at ``#`` or ``;`` preceded
  by whitespace;
- a line indented deeper than its option continues the option's value (joined with newlines);
- a value in double quotes is taken literally (no comment stripping) without the quotes.
"""

from __future__ import annotations

import re

DEFAULT_SECTION = "DEFAULT"

_SECTION = re.compile(r"^\[(?P<name>[^\]]+)\]\s*$")
_OPTION = re.compile(r"^(?P<key>[^=:\s][^=:]*?)\s*[=:]\s*(?P<value>.*)$")


class ParseError(ValueError):
    def __init__(self, message: str, line_number: int) -> None:
        super().__init__(f"line {line_number}: {message}")
        self.line_number = line_number


def _strip_inline_comment(value: str) -> str:
    for marker in "#;":
        index = value.find(marker)
        if index != -1:
            value = value[:index]
    return value.rstrip()


def _clean_value(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == '"':
        closing = value.find('"', 1)
        if closing != -1:
            return value[1:closing]
    return _strip_inline_comment(value)


def parse(text: str) -> dict[str, dict[str, str]]:
    """Parse INI text; return {section: {key: raw value}} in file order (DEFAULT first if present)."""
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    last_key: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped[0] in "#;":
            last_key = None if not stripped else last_key
            continue
        if line[0] in " \t" and current is not None and last_key is not None:
            current[last_key] += "\n" + stripped
            continue
        header = _SECTION.match(stripped)
        if header:
            name = header.group("name").strip()
            if name in sections:
                raise ParseError(f"duplicate section [{name}]", number)
            current = sections[name] = {}
            last_key = None
            continue
        option = _OPTION.match(stripped)
        if option is None:
            raise ParseError(f"cannot parse {stripped!r}; expected [section] or key = value", number)
        if current is None:
            raise ParseError(f"option {option.group('key')!r} appears before any [section]", number)
        key = option.group("key").strip().lower()
        if key in current:
            raise ParseError(f"duplicate option {key!r}", number)
        current[key] = _clean_value(option.group("value"))
        last_key = key
    return sections
