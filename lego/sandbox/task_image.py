"""Task images: the repository at base_commit baked onto the base image, built once, cached by content.

Anti-cheat at build time: the repository appears as a single commit whose tree is base_commit's tree —
no later history, no other refs, no reflog, no objects from any other commit. The tests of the task's
test_patch are never in it.
"""

from __future__ import annotations

import io
import json
import shlex
import tarfile
from pathlib import Path

import docker
from docker.errors import APIError, DockerException

from lego.cache import content_hash, sha256_file, tree_digest
from lego.errors import ImageBuildError, LegoError, tail
from lego.sandbox import SNAPSHOT, image
from lego.sandbox.env_image import ensure_env_image, env_image_tag
from lego.tasksets.task import Task

TASK_REPOSITORY = "lego-task"
BUILD_VERSION = "2"

SANITIZE = """
set -e
rm -rf {snap} && mkdir -p {snap}
git -C /tmp/lego-src archive {base} | tar -x -C {snap}
cd {snap}
git init -q
git add -A
GIT_AUTHOR_DATE=@1000000000 GIT_COMMITTER_DATE=@1000000000 git commit -q --allow-empty -m "base commit {base}"
git reflog expire --expire=now --all
git gc -q --prune=now
printf %s {base} > /opt/lego/base_commit
rm -rf /tmp/lego-src /tmp/lego-src.bundle
"""


class UnresolvedTaskPath(LegoError):
    """A task names its bundle or Dockerfile directory by a relative path: it was not loaded by a task-set loader."""


def task_image_tag(task: Task, base_image: str) -> str:
    env = task.environment
    if env.requires is not None and not env.requires.empty and env.kind == "bundle":
        # Built on the environment image: tasks that share a spec share it, and this key follows it.
        base_image = env_image_tag(env.requires, base_image)
    if env.kind == "bundle":
        # Keyed on the bundle's bytes, not on where this checkout keeps it: the same task set at another
        # path (another machine, another work tree) finds the images already built.
        parts = [env.model_dump_json(exclude={"bundle", "requires"}), sha256_file(_bundle_path(task))]
    elif env.kind == "dockerfile" and env.dockerfile_dir:
        # Keyed on the build context's content, as a bundle is on its bytes.
        parts = [env.model_dump_json(exclude={"dockerfile_dir", "requires"}),
                 tree_digest(_absolute(task, "dockerfile_dir", env.dockerfile_dir))]
    else:
        parts = [env.model_dump_json(exclude={"requires"})]
    if env.requires is not None and not env.requires.empty:
        parts.append(env.requires.key())
    key = content_hash(BUILD_VERSION, base_image, *parts, task.base_commit, SANITIZE, length=16)
    return f"{TASK_REPOSITORY}:{key}"


def _absolute(task: Task, field: str, value: str) -> Path:
    path = Path(value)
    if not path.is_absolute():
        raise UnresolvedTaskPath(
            f"task {task.instance_id}: environment.{field} is the relative path {value!r}, and a task carries no "
            "directory to resolve it against. The task-set loaders (lego.tasksets.load: load_tasks, "
            "load_configured) make it absolute when it exists next to the task set's file, so either the task "
            "was not loaded through them or that file is missing there: load the task set with them, put the "
            "file where the task set names it, or give an absolute path")
    return path


def _bundle_path(task: Task) -> Path:
    if not task.environment.bundle:
        raise ImageBuildError(f"task {task.instance_id} has environment.kind=bundle but no environment.bundle path")
    path = _absolute(task, "bundle", task.environment.bundle)
    if not path.is_file():
        raise ImageBuildError(f"task {task.instance_id}: git bundle {path} not found; rebuild or restore it, or "
                              "fix environment.bundle in the task set")
    return path


def _tar_single(name: str, data: bytes) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def ensure_task_image(client: docker.DockerClient, task: Task, base_image: str) -> str:
    """The task's image tag; built when missing."""
    from lego.sandbox.harbor_image import harbor_sandbox_task

    # A Harbor task's environment is a Dockerfile whose working dir is no git repository: served from the layer
    # that commits it at base_commit (any other task comes back unchanged).
    task = harbor_sandbox_task(client, task)
    tag = task_image_tag(task, base_image)
    if image.image_exists(client, tag):
        return tag
    env = task.environment
    source_image = env.image if env.kind == "image" else base_image
    if env.kind == "dockerfile":
        if not env.dockerfile_dir:
            raise ImageBuildError(f"task {task.instance_id}: environment.kind=dockerfile needs dockerfile_dir")
        try:
            source_image, _ = client.images.build(path=env.dockerfile_dir, tag=f"{tag}-env", network_mode="none")
            source_image = source_image.id
        except (APIError, DockerException) as exc:
            raise ImageBuildError(f"task {task.instance_id}: building {env.dockerfile_dir} failed: {exc}") from exc
    if not source_image:
        raise ImageBuildError(f"task {task.instance_id}: environment.kind=image needs environment.image")
    if env.requires is not None and not env.requires.empty:
        try:
            source_image = ensure_env_image(client, env.requires, source_image)
        except ImageBuildError as exc:
            raise ImageBuildError(f"task {task.instance_id}: its environment.requires: {exc}") from exc
    container = image.create_build_container(client, source_image,
                                             f"task {task.instance_id}: cannot start {source_image}")
    try:
        container.start()
        if env.kind == "bundle":
            bundle = _bundle_path(task).read_bytes()
            container.put_archive("/tmp", _tar_single("lego-src.bundle", bundle))
            fetch = "git clone -q --no-checkout /tmp/lego-src.bundle /tmp/lego-src"
        else:
            # The image holds the repo (with its full history) at workdir: take only base_commit's tree.
            fetch = f"mv {shlex.quote(env.workdir)} /tmp/lego-src"
        script = "mkdir -p /opt/lego\n" + fetch + "\n" + SANITIZE.format(snap=SNAPSHOT, base=shlex.quote(task.base_commit))
        script += "".join(f"\n(cd {SNAPSHOT} && {command})" for command in env.setup_commands)
        code, output = container.exec_run(["bash", "-c", script])
        if code != 0:
            raise ImageBuildError(
                f"task {task.instance_id}: preparing the repository at {task.base_commit} failed "
                f"(exit {code}): {tail(output.decode(errors='replace'))}"
            )
        image.commit_build_container(container, tag, {"lego.task": task.instance_id,
                                                      "lego.meta": json.dumps({"base_commit": task.base_commit})})
    except (APIError, DockerException) as exc:
        raise ImageBuildError(f"task {task.instance_id}: building its image failed: {exc}") from exc
    finally:
        image.remove_build_container(container)
    return tag
