"""Read-only directories for sandboxes on an engine that does not share this machine's file system.

A sandbox reads directories of the worker: the grading runner, a harness install. An engine on this machine
bind-mounts them. An engine elsewhere cannot see them, so there each directory travels once: into a named volume on
that engine, named by a hash of the directory's content. Each engine then holds one copy per content, and a changed
directory is a new volume.

Filling is safe when several workers need the same content at once:
- the container that fills a volume has a fixed name, so only one worker fills it and the others wait;
- a second, empty volume is created once the copy is complete. Only its presence lets a sandbox mount the content,
  so no sandbox ever sees a half-copied directory.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tarfile
import tempfile
import threading
import time
from pathlib import Path

import docker
from docker.errors import APIError, DockerException, NotFound

from lego.sandbox import SandboxError

CONTENT_LABEL = "lego.content"  # on content volumes: the directory they hold (a cache: never reaped)
VOLUME_PREFIX = "lego-content-"
FILL_TIMEOUT_S = 900.0  # another worker's fill of a large harness install over a slow link
_keys: dict[str, tuple[str, str]] = {}  # directory -> (its listing's signature, its content key)
_keys_lock = threading.Lock()


def _entries(directory: Path) -> list[tuple[str, os.stat_result]]:
    """Every path under `directory` (relative, sorted), with its lstat; symbolic links are not followed."""
    entries = []
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        for name in sorted([*dirs, *files]):
            path = Path(root) / name
            entries.append((path.relative_to(directory).as_posix(), path.lstat()))
    return sorted(entries)


def content_key(directory: Path) -> str:
    """A hash of what `directory` holds: each path, its kind and mode, and each file's bytes or link's target. The
    bytes are hashed again only when the listing's sizes or times change (a harness install is hundreds of MB)."""
    directory = Path(directory).resolve()
    entries = _entries(directory)
    signature = hashlib.sha256(repr([(name, st.st_mode, st.st_size, st.st_mtime_ns) for name, st in entries])
                               .encode()).hexdigest()
    with _keys_lock:
        known = _keys.get(str(directory))
    if known is not None and known[0] == signature:
        return known[1]
    digest = hashlib.sha256()
    for name, st in entries:
        digest.update(f"{name}\0{stat.S_IFMT(st.st_mode)}\0{stat.S_IMODE(st.st_mode)}\0".encode())
        path = directory / name
        if stat.S_ISLNK(st.st_mode):
            digest.update(os.readlink(path).encode())
        elif stat.S_ISREG(st.st_mode):
            with open(path, "rb") as file:
                for block in iter(lambda: file.read(1 << 20), b""):
                    digest.update(block)
        digest.update(b"\n")
    key = digest.hexdigest()
    with _keys_lock:
        _keys[str(directory)] = (signature, key)
    return key


def _archive(directory: Path, out) -> None:
    """`directory`'s content as a tar at its root, owned by root, modes kept (what a sandbox user may read)."""

    def owned_by_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    with tarfile.open(fileobj=out, mode="w") as archive:
        for name in sorted(os.listdir(directory)):
            archive.add(directory / name, arcname=name, filter=owned_by_root)


def _exists(client: docker.DockerClient, volume: str) -> bool:
    try:
        client.volumes.get(volume)
        return True
    except NotFound:
        return False


def ensure_content_volume(client: docker.DockerClient, directory: Path, helper_image: str,
                          owner_labels: dict[str, str] | None = None) -> str:
    """The name of the volume on `client`'s engine holding `directory`'s content, filled first if it is not there
    (from a container of `helper_image`, which the engine must have: a sandbox's base image). `owner_labels` go on
    the filling container, so that the sandbox reaper removes it if this process dies while it fills."""
    directory = Path(directory).resolve()
    if not directory.is_dir():
        raise SandboxError(f"{directory} is not a directory: nothing to copy to the Docker engine")
    name = VOLUME_PREFIX + content_key(directory)[:32]
    ready, filler = f"{name}-ready", f"{name}-fill"
    labels = {CONTENT_LABEL: str(directory)}
    deadline = time.monotonic() + FILL_TIMEOUT_S
    try:
        while not _exists(client, ready):
            client.volumes.create(name, labels=labels)  # an existing one is returned as it is
            try:  # the fixed name: one filler per volume and engine
                container = client.containers.create(helper_image, ["true"], name=filler, network_mode="none",
                                                     labels={**labels, **(owner_labels or {})},
                                                     volumes={name: {"bind": "/content", "mode": "rw"}})
            except APIError as exc:
                if exc.status_code != 409:
                    raise
                if time.monotonic() > deadline:
                    raise SandboxError(f"the copy of {directory} to the Docker engine (container {filler}) did "
                                       f"not finish in {FILL_TIMEOUT_S:.0f} s; if its worker died, remove that "
                                       "container (a new sandbox factory reaps it)") from exc
                time.sleep(0.5)  # another worker fills it
                continue
            try:
                if _exists(client, ready):  # another worker finished (and removed its filler) since the check
                    continue
                with tempfile.TemporaryFile() as archive:
                    _archive(directory, archive)
                    archive.seek(0)
                    if not container.put_archive("/content", archive):
                        raise SandboxError(f"the Docker engine refused the copy of {directory}")
                client.volumes.create(ready, labels=labels)
            finally:
                container.remove(force=True)
    except (APIError, DockerException) as exc:
        raise SandboxError(f"copying {directory} to the Docker engine as volume {name} failed: {exc}") from exc
    return name
