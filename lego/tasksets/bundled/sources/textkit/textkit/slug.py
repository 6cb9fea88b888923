"""URL slugs from arbitrary text."""

from __future__ import annotations

import re
import unicodedata

_NOT_ALNUM = re.compile(r"[^a-z0-9]+")


def to_ascii(text: str) -> str:
    """Drop accents and anything that has no ASCII form: "Crème brûlée" -> "Creme brulee"."""
    return unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")


def slugify(text: str, separator: str = "-", max_length: int | None = None) -> str:
    """Lowercase ASCII words joined by ``separator``: "Hello, World!" -> "hello-world".

    With ``max_length`` the slug is cut at a separator so that no word is split.
    """
    if not separator or _NOT_ALNUM.fullmatch(separator) is None:
        raise ValueError(f"separator must be punctuation such as '-' or '_', got {separator!r}")
    slug = _NOT_ALNUM.sub(separator, to_ascii(text).lower()).lstrip(separator)
    if max_length is not None and len(slug) > max_length:
        cut = slug.rfind(separator, 0, max_length + 1)
        slug = slug[:cut] if cut > 0 else slug[:max_length]
    return slug


def unique_slug(text: str, taken: set[str], separator: str = "-") -> str:
    """A slug not in ``taken``: "post", "post-2", "post-3", ..."""
    base = slugify(text, separator)
    slug, number = base, 2
    while slug in taken:
        slug = f"{base}{separator}{number}"
        number += 1
    return slug
