"""Writing a Config back to INI text that `parse` reads back to the same values."""

from __future__ import annotations

from pathlib import Path

from iniconf.config import Config
from iniconf.parser import DEFAULT_SECTION


def _format_value(value: str) -> str:
    if value != value.strip() or any(marker in value for marker in (" #", " ;", "\t#", "\t;")):
        if "\n" not in value and '"' not in value:
            return f'"{value}"'
    return value


def dumps(config: Config) -> str:
    blocks = []
    sections = [(DEFAULT_SECTION, config.defaults())] if config.defaults() else []
    sections += [(name, {key: config.get(name, key, raw=True) for key in config.options(name)
                         if key not in config.defaults() or config.get(name, key, raw=True) != config.defaults()[key]})
                 for name in config.sections()]
    for name, options in sections:
        lines = [f"[{name}]"]
        lines += [f"{key} = {_format_value(value)}" for key, value in options.items()]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n" if blocks else ""


def dump(config: Config, path: str | Path) -> None:
    Path(path).write_text(dumps(config), encoding="utf-8")
