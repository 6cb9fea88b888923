"""Environment images: a source image (the base image, or a task's own) plus what `environment.requires` lists.

Built without a network: the packages are fetched on the host (lego/tasksets/packages.py), copied into a
container that has network mode none, and installed there from those files only (`dpkg -i`, `pip install
--no-index --find-links`); then the setup commands run, still without a network, and the container is committed.
The tag is a content hash of the source image and the spec, so every task with the same spec shares the image.
"""

from __future__ import annotations

import io
import json
import shlex
import tarfile
from pathlib import Path

import docker
from docker.errors import APIError, DockerException

from lego.cache import content_hash
from lego.errors import ImageBuildError, tail
from lego.sandbox import image
from lego.tasksets.environment import EnvironmentSpec
from lego.tasksets.packages import PackageFetchError, debian_archives, python_tag, wheelhouse

ENV_REPOSITORY = "lego-env"
ENV_BUILD_VERSION = "1"
STAGE = "/tmp/lego-env"
# Debian's python3-venv brings pip as a wheel (python3-pip-whl); a wheel of pip runs as pip itself.
PIP = "$(ls /usr/share/python-wheels/pip-*.whl 2>/dev/null | head -n 1)/pip"


def env_image_tag(spec: EnvironmentSpec, source_image: str) -> str:
    return f"{ENV_REPOSITORY}:{content_hash(ENV_BUILD_VERSION, source_image, spec.key(), length=16)}"


def _tar_directories(entries: dict[str, Path]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, directory in entries.items():
            for path in sorted(directory.iterdir()):
                if path.is_file() and not path.name.startswith("."):
                    archive.add(path, arcname=f"{name}/{path.name}")
    return buffer.getvalue()


def _exec(container, script: str, what: str) -> str:
    code, output = container.exec_run(["bash", "-c", script])
    text = output.decode(errors="replace")
    if code != 0:
        raise ImageBuildError(f"{what} failed (exit {code}): {tail(text)}")
    return text


def ensure_env_image(client: docker.DockerClient, spec: EnvironmentSpec, source_image: str) -> str:
    """The image of `source_image` with `spec` installed; built when missing."""
    tag = env_image_tag(spec, source_image)
    if image.image_exists(client, tag):
        return tag
    container = image.create_build_container(client, source_image,
                                             f"cannot start {source_image} to install the environment")
    try:
        container.start()
        stage: dict[str, Path] = {}
        try:
            if spec.debian:
                status = _read_file(container, "/var/lib/dpkg/status")
                suite = _exec(container, ". /etc/os-release && printf %s \"$VERSION_CODENAME\"", "reading the suite")
                stage["debs"] = debian_archives(spec.debian, status, suite)
            if spec.python:
                inside = _exec(container, "python3 -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])'",
                               "asking the image for its Python").strip()
                if inside != python_tag():
                    raise ImageBuildError(
                        f"the environment's Python packages are fetched as wheels for the host's Python {python_tag()}, "
                        f"but {source_image} has Python {inside}; run Lego with a Python {inside} interpreter")
                stage["wheels"] = wheelhouse(spec.python)
        except PackageFetchError as exc:
            raise ImageBuildError(str(exc)) from exc
        if stage:
            container.put_archive("/tmp", _tar_directories({f"lego-env/{k}": v for k, v in stage.items()}))
        steps = ["set -e"]
        if spec.debian:
            steps.append(f"dpkg -i {STAGE}/debs/*.deb")
        if spec.python:
            # --break-system-packages: this image is the environment (PEP 668 guards a shared system's Python).
            steps.append(f"python3 {PIP} install --no-index --find-links {STAGE}/wheels --no-cache-dir "
                         "--disable-pip-version-check --root-user-action=ignore --break-system-packages "
                         + " ".join(shlex.quote(item) for item in spec.python))
        steps.append(f"rm -rf {STAGE}")
        steps += [f"(cd / && {command})" for command in spec.setup]
        _exec(container, "\n".join(steps), f"installing the environment {spec.key()} ({_describe(spec)}) offline")
        image.commit_build_container(container, tag,
                                     {"lego.env": spec.model_dump_json(), "lego.source_image": source_image})
    except (APIError, DockerException) as exc:
        raise ImageBuildError(f"building the environment image {tag} failed: {exc}") from exc
    finally:
        image.remove_build_container(container)
    return tag


def _read_file(container, path: str) -> bytes:
    stream, _ = container.get_archive(path)
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as archive:
        member = archive.next()
        handle = archive.extractfile(member) if member else None
        return handle.read() if handle else b""


def _describe(spec: EnvironmentSpec) -> str:
    parts = json.loads(spec.model_dump_json(include={"python", "debian", "setup"}))
    return ", ".join(f"{key}: {' '.join(value)}" for key, value in parts.items() if value)
