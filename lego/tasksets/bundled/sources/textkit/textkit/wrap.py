"""Greedy word wrapping with first-line and continuation indents."""

from __future__ import annotations


def wrap(text: str, width: int = 70, initial_indent: str = "", subsequent_indent: str = "") -> list[str]:
    """Split ``text`` into lines of at most ``width`` characters, indents included.

    Words are never broken: a word longer than the room on a line gets a line of its own.
    """
    if width <= 0:
        raise ValueError("width must be positive")
    lines: list[str] = []
    current: list[str] = []
    length = 0
    for word in text.split():
        added = len(word) + (1 if current else 0)
        if current and len(initial_indent) + length + added > width:
            indent = initial_indent if not lines else subsequent_indent
            lines.append(indent + " ".join(current))
            current, length = [], 0
            added = len(word)
        current.append(word)
        length += added
    if current:
        indent = initial_indent if not lines else subsequent_indent
        lines.append(indent + " ".join(current))
    return lines


def fill(text: str, width: int = 70, initial_indent: str = "", subsequent_indent: str = "") -> str:
    """Wrap each paragraph (separated by blank lines) and join them back with blank lines."""
    paragraphs = [p for p in text.split("\n\n") if p.strip()]
    return "\n\n".join("\n".join(wrap(p, width, initial_indent, subsequent_indent)) for p in paragraphs)


def indent(text: str, prefix: str) -> str:
    """Prefix every non-blank line."""
    return "".join(prefix + line if line.strip() else line for line in text.splitlines(keepends=True))
