"""``${key}`` and ``${section:key}`` references inside values."""

from __future__ import annotations

import re
from collections.abc import Callable

_REFERENCE = re.compile(r"\$\{(?:(?P<section>[^:}]+):)?(?P<key>[^}:]+)\}")

Lookup = Callable[[str, str], "str | None"]


class InterpolationError(ValueError):
    """A reference to a missing option, or references that form a cycle."""


def references(value: str) -> list[tuple[str | None, str]]:
    return [(m.group("section"), m.group("key").strip().lower()) for m in _REFERENCE.finditer(value)]


def interpolate(value: str, section: str, lookup: Lookup) -> str:
    """Replace every reference in ``value`` (read in ``section``) by the referenced option's value."""

    def replace(match: re.Match) -> str:
        ref_section = (match.group("section") or section).strip()
        ref_key = match.group("key").strip().lower()
        raw = lookup(ref_section, ref_key)
        if raw is None:
            raise InterpolationError(f"[{section}] references ${{{ref_section}:{ref_key}}}, which does not exist")
        return raw

    return _REFERENCE.sub(replace, value)
