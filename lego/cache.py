"""The per-machine download cache (tokenizer, base-image rootfs, harness installs, an empty MLflow store).

It speeds up reruns on one machine; nothing depends on it being present.
"""

import hashlib
import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    root = Path(os.environ.get("LEGO_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lego")
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def content_hash(*parts: str | bytes, length: int = 16) -> str:
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()[:length]
