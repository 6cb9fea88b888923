"""textkit: slugs, truncation, wrapping and naming-style conversion."""

from textkit.case import to_camel as to_camel, to_constant as to_constant, to_kebab as to_kebab
from textkit.case import to_pascal as to_pascal, to_snake as to_snake, to_title as to_title
from textkit.slug import slugify as slugify, unique_slug as unique_slug
from textkit.truncate import shorten as shorten, truncate as truncate
from textkit.words import split_words as split_words
from textkit.wrap import fill as fill, indent as indent, wrap as wrap

__version__ = "0.3.0"
