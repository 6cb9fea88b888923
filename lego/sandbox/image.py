"""The sandbox base image, built offline.

debootstrap (minbase) writes a Debian root file system from the machine's own apt mirror, which is
packed into a tarball kept in the download cache and `docker import`ed under a tag that is a content
hash of the recipe: the image is rebuilt only when the recipe changes, and a fresh Docker data root
only pays the import (seconds), not the debootstrap (minutes), when the cache is warm.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import docker
from docker.errors import APIError, DockerException, ImageNotFound
from rich.console import Console

from lego.cache import cache_dir, content_hash
from lego.config import DockerConfig
from lego.errors import ImageBuildError, tail

RECIPE_VERSION = "3"  # bump when the build steps below change
BASE_REPOSITORY = "lego-base"
IMAGE_ENV = [
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG=C.UTF-8",
    "PYTHONDONTWRITEBYTECODE=1",
    "HOME=/root",
]
# Written into the root file system: commits in the sandbox work as any user, in any repo path.
GITCONFIG = """[user]
\tname = lego
\temail = lego@localhost
[safe]
\tdirectory = *
[init]
\tdefaultBranch = main
[advice]
\tdetachedHead = false
"""


def recipe(config: DockerConfig) -> dict:
    return {
        "version": RECIPE_VERSION,
        "suite": config.debian_suite,
        "packages": sorted(set(config.base_image_packages)),
        "env": IMAGE_ENV,
        "gitconfig": GITCONFIG,
    }


def base_image_tag(config: DockerConfig) -> str:
    return f"{BASE_REPOSITORY}:{content_hash(json.dumps(recipe(config), sort_keys=True), length=12)}"


def apt_mirror() -> str:
    """The Debian mirror this machine's apt uses (never hard-coded: machines differ)."""
    if os.environ.get("LEGO_DEBIAN_MIRROR"):
        return os.environ["LEGO_DEBIAN_MIRROR"]
    sources = []
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        if path.is_file() and not path.name.endswith((".disabled", ".save")) and "disabled" not in path.name:
            sources.append(path.read_text(errors="replace"))
    text = "\n".join(sources)
    candidates = re.findall(r"^\s*URIs:\s*(\S+)", text, flags=re.M)
    candidates += re.findall(r"^\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)", text, flags=re.M)
    for uri in candidates:
        if "security" not in uri and uri.rstrip("/").endswith("debian"):
            return uri
    raise ImageBuildError(
        "cannot find a Debian mirror in /etc/apt/sources.list(.d); set LEGO_DEBIAN_MIRROR to one"
    )


def rootfs_tarball(config: DockerConfig, console: Console | None = None) -> Path:
    """The cached root file system tarball for the recipe, built with debootstrap if missing."""
    key = base_image_tag(config).split(":")[1]
    tarball = cache_dir("rootfs") / f"{key}.tar"
    if tarball.exists():
        return tarball
    if shutil.which("debootstrap") is None:
        raise ImageBuildError("debootstrap is not installed; run `apt-get install debootstrap` (Debian/Ubuntu)")
    if os.geteuid() != 0:
        raise ImageBuildError("building the base image with debootstrap needs root; run `lego setup` as root")
    packages = ",".join(recipe(config)["packages"])
    with tempfile.TemporaryDirectory(prefix="lego-rootfs-", dir=cache_dir("rootfs")) as scratch:
        root = Path(scratch) / "root"
        command = ["debootstrap", "--variant=minbase", f"--include={packages}", config.debian_suite, str(root),
                   apt_mirror()]
        if console:
            console.print(f"[bold]building the sandbox base image[/] ({config.debian_suite}, {packages}); "
                          "this takes 1-3 minutes once per recipe")
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise ImageBuildError(
                f"debootstrap failed (exit {result.returncode}):\n{tail(result.stdout + result.stderr)}"
            )
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for item in (root / junk).glob("*"):
                if item.is_file():
                    item.unlink()
        (root / "etc" / "gitconfig").write_text(GITCONFIG)
        partial = tarball.with_suffix(".tar.partial")
        subprocess.run(["tar", "-C", str(root), "-cf", str(partial), "."], check=True)
        partial.rename(tarball)
    return tarball


def image_exists(client: docker.DockerClient, tag: str) -> bool:
    try:
        client.images.get(tag)
        return True
    except ImageNotFound:
        return False


def ensure_base_image(client: docker.DockerClient, config: DockerConfig, console: Console | None = None) -> str:
    """Return the base image tag, importing (and if needed building) it only when missing."""
    tag = base_image_tag(config)
    if image_exists(client, tag):
        return tag
    tarball = rootfs_tarball(config, console)
    repository, version = tag.split(":")
    changes = [f"ENV {item}" for item in IMAGE_ENV] + ["WORKDIR /", f"LABEL lego.recipe={version}"]
    try:
        with open(tarball, "rb") as data:
            client.api.import_image_from_data(data, repository=repository, tag=version, changes=changes)
    except Exception as exc:  # the SDK surfaces daemon errors as several types
        raise ImageBuildError(f"docker import of {tarball} failed: {exc}") from exc
    if not image_exists(client, tag):
        raise ImageBuildError(f"docker import reported success but {tag} is not in the engine")
    return tag


def create_build_container(client: docker.DockerClient, image: str, failure: str, **options):
    """A container (created, not started) that prepares an image from `image`: no network, idle until Lego execs
    into it, labelled as a build of this process so that a reclaim after a crash finds it. A failure raises
    ImageBuildError with `failure` in front of the engine's message."""
    labels = {"lego.sandbox": "build", "lego.owner_pid": str(os.getpid()), "lego.host": socket.gethostname()}
    try:
        return client.containers.create(image, ["sleep", "infinity"], network_mode="none", labels=labels, **options)
    except (APIError, DockerException) as exc:
        raise ImageBuildError(f"{failure}: {exc}") from exc


def commit_build_container(container, tag: str, labels: dict[str, str], **conf) -> None:
    """Stop a container that prepared an image and commit it as `tag`; sandboxes started from it idle
    (`sleep infinity`) until Lego execs into them."""
    container.stop(timeout=1)
    repository, version = tag.split(":")
    container.commit(repository=repository, tag=version, conf={"Labels": labels, "Cmd": ["sleep", "infinity"], **conf})


def remove_build_container(container) -> None:
    """Remove a build container whatever became of it: its image is committed or its failure already reported."""
    try:
        container.remove(force=True)
    except (APIError, DockerException):
        pass
