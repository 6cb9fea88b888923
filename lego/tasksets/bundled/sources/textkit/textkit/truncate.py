"""Shortening text to a maximum width, with a placeholder marking the cut."""

from __future__ import annotations


def truncate(text: str, width: int, placeholder: str = "...", break_words: bool = True) -> str:
    """Return ``text`` unchanged if it fits in ``width`` characters; otherwise cut it and append
    ``placeholder`` so that the result is at most ``width`` long. With ``break_words=False`` the cut
    falls between words (a single overlong first word is still cut)."""
    if width < len(placeholder):
        raise ValueError(f"width {width} is smaller than the placeholder {placeholder!r}")
    if len(text) <= width:
        return text
    room = width - len(placeholder)
    if break_words:
        return text[:room].rstrip() + placeholder
    cut = text.rfind(" ", 0, width)
    if cut <= 0:
        return text[:room] + placeholder
    return text[:cut].rstrip() + placeholder


def shorten(text: str, width: int, placeholder: str = "...") -> str:
    """Collapse runs of whitespace, then truncate between words."""
    return truncate(" ".join(text.split()), width, placeholder, break_words=False)
