"""The per-machine download cache (tokenizer, base-image rootfs, harness installs, an empty MLflow store).

It speeds up reruns on one machine; nothing depends on it being present.
"""

import hashlib
import os
import stat
import threading
from collections.abc import Callable
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


def derived_seed(*parts: object) -> int:
    """A non-negative 63-bit seed named by `parts` (their text, hashed as content_hash does)."""
    return int(content_hash(*(str(part) for part in parts)), 16) >> 1


def seed_database_from(db: Path, template: Callable[[], Path], unavailable: tuple[type[BaseException], ...] = (OSError,)
                       ) -> None:
    """`seed_database` with the template built on demand, where `db` does not exist yet; when the template cannot be
    had (`unavailable`: no writable machine cache, a failed build), the database's own program creates `db`."""
    if db.exists():
        return
    try:
        built = template()
    except unavailable:
        return
    seed_database(db, built)


def seed_database(db: Path, template: Path) -> bool:
    """Put a copy of the SQLite database `template` at `db` unless `db` exists (never replaced, also when another
    process creates it meanwhile). Returns whether `db` is the copy."""
    import contextlib
    import sqlite3
    import tempfile

    db.parent.mkdir(parents=True, exist_ok=True)
    handle, staged = tempfile.mkstemp(prefix=f".{db.name}.", dir=db.parent)
    os.close(handle)
    try:
        os.chmod(staged, 0o644)  # as the database's own program creates it
        with contextlib.closing(sqlite3.connect(template)) as reader, \
                contextlib.closing(sqlite3.connect(staged)) as writer:
            reader.backup(writer)  # a consistent copy, also of a database in WAL mode
        try:
            os.link(staged, db)
        except FileExistsError:
            return False
        return True
    finally:
        os.unlink(staged)


_TREE_DIGESTS: dict[str, tuple[tuple, str]] = {}
_TREE_DIGESTS_LOCK = threading.Lock()


def tree_digest(root: Path) -> str:
    """The content of a directory (relative paths, kinds, executable bits, bytes, link targets), not where it is
    kept: a build context exported again at another path keys the same images and plans. Read again only when a
    file's size, time or mode changed since this process last read it."""
    entries = []
    for directory, subdirectories, files in os.walk(root):
        subdirectories.sort()
        links = [name for name in subdirectories if os.path.islink(os.path.join(directory, name))]
        for name in sorted([*files, *links]):
            path = os.path.join(directory, name)
            info = os.lstat(path)
            entries.append((os.path.relpath(path, root), info.st_size, info.st_mtime_ns, info.st_mode))
    signature = tuple(entries)
    key = os.path.abspath(root)
    with _TREE_DIGESTS_LOCK:
        known = _TREE_DIGESTS.get(key)
    if known is not None and known[0] == signature:
        return known[1]
    digest = hashlib.sha256()
    for relative, _, _, mode in entries:
        path = os.path.join(root, relative)
        if stat.S_ISLNK(mode):
            body = b"link:" + os.readlink(path).encode()
        else:
            body = (b"x:" if mode & 0o111 else b"f:") + bytes.fromhex(sha256_file(Path(path)))
        digest.update(content_hash(relative, body, length=64).encode())
    value = digest.hexdigest()
    with _TREE_DIGESTS_LOCK:
        _TREE_DIGESTS[key] = (signature, value)
    return value
