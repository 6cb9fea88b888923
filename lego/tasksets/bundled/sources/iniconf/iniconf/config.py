"""The Config object: sections of options with DEFAULT fallback, typed getters and interpolation."""

from __future__ import annotations

from pathlib import Path

from iniconf.interpolate import interpolate
from iniconf.parser import DEFAULT_SECTION, parse

_MISSING = object()
_BOOLEANS = {"1": True, "yes": True, "true": True, "on": True,
             "0": False, "no": False, "false": False, "off": False}


class NoOptionError(KeyError):
    def __init__(self, section: str, key: str) -> None:
        super().__init__(f"no option {key!r} in section [{section}]")
        self.section, self.key = section, key


class Config:
    def __init__(self, sections: dict[str, dict[str, str]] | None = None) -> None:
        self._sections: dict[str, dict[str, str]] = {}
        self._defaults: dict[str, str] = {}
        for name, options in (sections or {}).items():
            for key, value in options.items():
                self.set(name, key, value)

    @classmethod
    def from_string(cls, text: str) -> Config:
        return cls(parse(text))

    @classmethod
    def from_file(cls, path: str | Path) -> Config:
        return cls.from_string(Path(path).read_text(encoding="utf-8"))

    # structure

    def sections(self) -> list[str]:
        return list(self._sections)

    def has_section(self, section: str) -> bool:
        return section in self._sections

    def add_section(self, section: str) -> None:
        if section == DEFAULT_SECTION:
            return
        self._sections.setdefault(section, {})

    def options(self, section: str) -> list[str]:
        own = list(self._sections.get(section, {}))
        return own + [key for key in self._defaults if key not in own]

    def has_option(self, section: str, key: str) -> bool:
        return self._raw(section, key.lower()) is not None

    def set(self, section: str, key: str, value: str) -> None:
        if not isinstance(value, str):
            raise TypeError(f"option values are strings; got {type(value).__name__} for {key!r}")
        if section == DEFAULT_SECTION:
            self._defaults[key.lower()] = value
        else:
            self.add_section(section)
            self._sections[section][key.lower()] = value

    def remove_option(self, section: str, key: str) -> bool:
        options = self._defaults if section == DEFAULT_SECTION else self._sections.get(section, {})
        return options.pop(key.lower(), None) is not None

    def defaults(self) -> dict[str, str]:
        return dict(self._defaults)

    # reading

    def _raw(self, section: str, key: str) -> str | None:
        if section != DEFAULT_SECTION and key in self._sections.get(section, {}):
            return self._sections[section][key]
        return self._defaults.get(key)

    def _lookup(self, section: str, key: str) -> str | None:
        if section == DEFAULT_SECTION:
            return self._defaults.get(key)
        return self._sections.get(section, {}).get(key)

    def get(self, section: str, key: str, fallback=_MISSING, raw: bool = False) -> str:
        value = self._raw(section, key.lower())
        if value is None:
            if fallback is _MISSING:
                raise NoOptionError(section, key)
            return fallback
        return value if raw else interpolate(value, section, self._lookup)

    def getint(self, section: str, key: str, fallback=_MISSING) -> int:
        value = self.get(section, key, fallback)
        return value if value is fallback else int(value)

    def getfloat(self, section: str, key: str, fallback=_MISSING) -> float:
        value = self.get(section, key, fallback)
        return value if value is fallback else float(value)

    def getbool(self, section: str, key: str, fallback=_MISSING) -> bool:
        value = self.get(section, key, fallback)
        if value is fallback:
            return value
        if value not in _BOOLEANS:
            raise ValueError(f"[{section}] {key} = {value!r} is not a boolean (use yes/no, true/false, on/off, 1/0)")
        return _BOOLEANS[value]

    def getlist(self, section: str, key: str, fallback=_MISSING, separator: str = ",") -> list[str]:
        """Items split on ``separator`` and on newlines (multi-line values), blanks dropped."""
        value = self.get(section, key, fallback)
        if value is fallback:
            return value
        items = []
        for line in value.splitlines():
            items.extend(item.strip() for item in line.split(separator))
        return [item for item in items if item]

    def items(self, section: str) -> dict[str, str]:
        return {key: self.get(section, key) for key in self.options(section)}

    def to_dict(self) -> dict[str, dict[str, str]]:
        return {section: self.items(section) for section in self.sections()}
