"""What the rollouts of one worker share: a started proxy over the policy engine, a sandbox factory and the
harness install."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import docker

from lego.config import LegoConfig
from lego.harness.base import BESIDE_ENV, HarnessAdapter, get_harness
from lego.harness.forkserver import Forkserver, start_forkserver
from lego.harness.install import ensure_installed
from lego.proxy.server import ProxyServer
from lego.sandbox import SandboxFactory
from lego.tasksets.task import Task


@dataclass
class RolloutResources:
    proxy: ProxyServer
    factory: SandboxFactory
    docker_host: str  # for harnesses that run beside the sandbox and exec into it
    install_dir: Path
    artifacts_dir: Path | None = None  # transcripts go to <artifacts_dir>/<rollout id>/
    # The engine that answers a task's session; None: the proxy's (the policy). A scripted policy (the warm
    # start's gold solutions) answers each task with replies of its own.
    engine_for: Callable[[Task], object] | None = None
    forkserver: Forkserver | None = None  # a beside harness's preloaded imports, forked per rollout


@contextlib.asynccontextmanager
async def rollout_resources(config: LegoConfig, work, engine, *, harness: str | None = None,
                            docker_client: docker.DockerClient | None = None, docker_host: str | None = None,
                            base_image: str | None = None,
                            tokenizer=None) -> AsyncIterator[tuple[HarnessAdapter, RolloutResources]]:
    """The harness adapter and a started proxy over `engine` with a Docker sandbox factory, for one worker."""
    from lego.engine.tokenizer import load_tokenizer
    from lego.sandbox.daemon import docker_engine
    from lego.sandbox.docker_sandbox import DockerSandboxFactory
    from lego.sandbox.image import ensure_base_image

    adapter = get_harness(harness or config.harness.name)
    install = await asyncio.to_thread(ensure_installed, adapter, config.harness.version)
    async with contextlib.AsyncExitStack() as stack:
        if docker_client is None:
            engine_info = stack.enter_context(docker_engine(work.docker_root, config.docker.host,
                                                            config.docker.start_private_daemon))
            docker_client, docker_host = engine_info.client, engine_info.base_url
        docker_host = docker_host or os.environ.get("DOCKER_HOST", "")
        if base_image is None:
            base_image = await asyncio.to_thread(ensure_base_image, docker_client, config.docker)
        # No shared unix socket: each sandbox rollout gets a socket of its own session (see attempt.py).
        proxy = ProxyServer(engine, tokenizer or load_tokenizer(), config.sampling, unix_socket=False)
        await proxy.start()
        stack.push_async_callback(proxy.stop)
        if config.sandbox.backend == "harbor":
            from lego.sandbox.harbor_backend import HarborSandboxFactory

            factory = HarborSandboxFactory(docker_client, config.sandbox, base_image=base_image,
                                           work_root=Path(work.root), docker_host=docker_host)
        else:
            factory = DockerSandboxFactory(docker_client, config.sandbox, base_image=base_image,
                                           proxy_channel=config.docker.proxy_channel,
                                           files_channel=config.docker.files_channel)
        forkserver = None
        if adapter.spec.runs == "beside" and adapter.spec.preload and config.harness.forkserver:
            # started from this (the loop's) thread, which outlives the rollouts: it ends with it
            forkserver = start_forkserver(install / "venv" / "bin" / "python", adapter.spec.preload,
                                          {"DOCKER_HOST": docker_host, **BESIDE_ENV})
            stack.callback(forkserver.stop)
        yield adapter, RolloutResources(proxy=proxy, factory=factory, docker_host=docker_host, install_dir=install,
                                        artifacts_dir=Path(work.artifacts) / "transcripts", forkserver=forkserver)
