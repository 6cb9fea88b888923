"""The policy a stage runs: a checkpoint, its version and its content key."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lego.pipeline.keys import checkpoint_key


@dataclass(frozen=True)
class Policy:
    path: Path
    version: int
    key: str

    @classmethod
    def from_path(cls, path: str | Path, key: str | None = None) -> Policy:
        from lego.engine.checkpoint import policy_version

        path = Path(path)
        return cls(path=path, version=policy_version(path), key=key or checkpoint_key(path))

    def as_data(self) -> dict:
        return {"policy_path": str(self.path), "policy_version": self.version, "policy_key": self.key}

    @classmethod
    def from_data(cls, data: dict) -> Policy:
        return cls(Path(data["policy_path"]), int(data["policy_version"]), data["policy_key"])
