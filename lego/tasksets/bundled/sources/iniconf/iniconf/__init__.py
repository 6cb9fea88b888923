"""iniconf: a small INI configuration parser with typed getters, interpolation and a writer."""

from iniconf.config import Config, NoOptionError
from iniconf.interpolate import InterpolationError
from iniconf.parser import DEFAULT_SECTION, ParseError, parse
from iniconf.writer import dump, dumps

__all__ = ["Config", "DEFAULT_SECTION", "InterpolationError", "NoOptionError", "ParseError", "dump", "dumps", "parse"]
__version__ = "0.2.0"
