"""Harbor environments as Lego task images.

A Harbor task's environment is a Dockerfile whose WORKDIR holds the files the agent works on, usually not a git
repository, and its identity is the content hash of that directory (`base_commit = harbor-env-<digest>`, see
lego/tasksets/load.py). Lego's task images take the repository at base_commit from the image
(lego/sandbox/task_image.py), and its diffs and grading are git's, so the environment image gets one more layer:
the working directory committed as it stands and tagged with the task's base_commit. The task is then served as
an `image` task on that layer, and everything downstream (snapshot, sandbox, diff, grading) is unchanged.

What this needs from a Harbor environment: bash and git in the image (Lego's diff and grading use them), and
a Dockerfile that builds without a network (no registry is reachable from the engines Lego starts).
"""

from __future__ import annotations

import shlex
from pathlib import Path

import docker
from docker.errors import APIError, BuildError, DockerException

from lego.cache import content_hash, tree_digest
from lego.errors import ImageBuildError, tail
from lego.sandbox import image
from lego.tasksets.task import Task, has_harbor_environment

HARBOR_ENV_REPOSITORY = "lego-harbor-env"
LAYER_VERSION = "1"
# -f: files a .gitignore would hide are still part of the environment the task was written against.
COMMIT_WORKDIR = """
set -e
cd {workdir}
git -c safe.directory='*' init -q 2>/dev/null || true
git -c safe.directory='*' add -A -f
git -c safe.directory='*' -c user.name=lego -c user.email=lego@localhost -c commit.gpgsign=false \\
    commit -q --allow-empty --no-verify -m "harbor environment {tag}"
git -c safe.directory='*' tag -f {tag}
"""


def harbor_layer_tag(task: Task) -> str:
    env = task.environment
    # The build context by content, not by where it was exported to.
    context = [env.model_dump_json(exclude={"dockerfile_dir"}), tree_digest(Path(env.dockerfile_dir))] \
        if env.dockerfile_dir else [env.model_dump_json()]
    key = content_hash(LAYER_VERSION, *context, task.base_commit, COMMIT_WORKDIR, length=16)
    return f"{HARBOR_ENV_REPOSITORY}:{key}"


def harbor_sandbox_task(client: docker.DockerClient, task: Task) -> Task:
    """`task` served from its Harbor environment with the working directory committed at base_commit (built once,
    cached by content); any other task unchanged."""
    env = task.environment
    if not has_harbor_environment(task) or env.kind != "dockerfile":
        return task
    if not env.dockerfile_dir:
        raise ImageBuildError(f"Harbor task {task.instance_id}: environment.kind=dockerfile needs dockerfile_dir")
    tag = harbor_layer_tag(task)
    served = task.model_copy(update={"environment": env.model_copy(
        update={"kind": "image", "image": tag, "dockerfile_dir": None})})
    if image.image_exists(client, tag):
        return served
    try:
        built, _ = client.images.build(path=env.dockerfile_dir, tag=f"{tag}-build", network_mode="none", rm=True)
    except (BuildError, APIError, DockerException) as exc:
        raise ImageBuildError(
            f"Harbor task {task.instance_id}: building {env.dockerfile_dir} failed: {tail(str(exc))}. The "
            "environment must build without a network: base it on an image the engine already has") from exc
    container = image.create_build_container(
        client, built.id, f"Harbor task {task.instance_id}: cannot start its environment image", user="0",
        entrypoint=[])
    try:
        container.start()
        script = COMMIT_WORKDIR.format(workdir=shlex.quote(env.workdir), tag=shlex.quote(task.base_commit))
        code, output = container.exec_run(["bash", "-c", script], user="0")
        if code != 0:
            raise ImageBuildError(
                f"Harbor task {task.instance_id}: committing {env.workdir} in its environment failed (exit {code}): "
                f"{tail(output.decode(errors='replace'))}. Lego needs bash and git in a Harbor environment image")
        image.commit_build_container(container, tag, {"lego.task": task.instance_id}, Entrypoint=[], User="0")
    except (APIError, DockerException) as exc:
        raise ImageBuildError(f"Harbor task {task.instance_id}: preparing its environment failed: {exc}") from exc
    finally:
        image.remove_build_container(container)
    return served
