"""Read-only directories as content volumes (lego/sandbox/content_volume.py), on the test engine with the files
channel forced to "volume" (what an engine elsewhere gets): a sandbox reads the directory's files and cannot write
them; one volume per content and engine, filled once even when workers ask at once; changed content is a new
volume. tests/test_remote_engine.py grades and runs a sandbox harness on an engine that shares no file system."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from lego.sandbox.content_volume import CONTENT_LABEL, content_key, ensure_content_volume

pytestmark = pytest.mark.docker


@pytest.fixture
def directory(tmp_path):
    root = tmp_path / "install"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "tool").write_text("#!/bin/sh\necho tool ran\n")
    (root / "bin" / "tool").chmod(0o755)
    (root / "data.txt").write_text("payload\n")
    os.symlink("bin/tool", root / "tool")
    return root


@pytest.fixture
def volumes(docker_engine):
    """Content volumes this test made, removed after it."""
    before = {volume.name for volume in docker_engine.client.volumes.list(filters={"label": CONTENT_LABEL})}
    yield
    for volume in docker_engine.client.volumes.list(filters={"label": CONTENT_LABEL}):
        if volume.name not in before:
            volume.remove(force=True)


def test_a_directory_reaches_the_sandbox_as_a_read_only_copy(docker_engine, lego_config, base_image, calc_image,
                                                             directory, volumes):
    from lego.sandbox.docker_sandbox import DockerSandboxFactory

    factory = DockerSandboxFactory(docker_engine.client, lego_config.sandbox, base_image=base_image,
                                   files_channel="volume", reap=False)
    with factory.open(calc_image, mounts={str(directory): "/opt/install"}) as sandbox:
        assert sandbox.exec("cat /opt/install/data.txt").output == "payload\n"
        assert sandbox.exec("/opt/install/tool").output.strip() == "tool ran"  # modes and links kept
        assert sandbox.exec("stat -c %U /opt/install/data.txt").output.strip() == "root"
        assert sandbox.exec("echo x > /opt/install/data.txt").exit_code != 0
        mounted = {m["Destination"]: m for m in docker_engine.client.api.inspect_container(sandbox.sandbox_id)["Mounts"]}
    assert mounted["/opt/install"]["Type"] == "volume" and not mounted["/opt/install"]["RW"]
    name = mounted["/opt/install"]["Name"]
    assert name == ensure_content_volume(docker_engine.client, directory, base_image)  # the same content, once
    (directory / "data.txt").write_text("changed\n")
    changed = ensure_content_volume(docker_engine.client, directory, base_image)
    assert changed != name
    with factory.open(calc_image, mounts={str(directory): "/opt/install"}) as sandbox:
        assert sandbox.exec("cat /opt/install/data.txt").output == "changed\n"


def test_workers_asking_at_once_get_one_volume_filled_once(docker_engine, base_image, directory, volumes,
                                                           monkeypatch):
    from docker.models.containers import Container

    client = docker_engine.client
    fills = []
    put_archive = Container.put_archive

    def counted(container, *args, **kwargs):
        fills.append(container.name)
        return put_archive(container, *args, **kwargs)

    monkeypatch.setattr(Container, "put_archive", counted)
    with ThreadPoolExecutor(4) as pool:
        names = list(pool.map(lambda _: ensure_content_volume(client, directory, base_image), range(4)))
    assert len(set(names)) == 1 and len(fills) == 1
    assert {volume.name for volume in client.volumes.list(filters={"label": CONTENT_LABEL})} >= {
        names[0], names[0] + "-ready"}
    assert not client.containers.list(all=True, filters={"name": names[0] + "-fill"})


def test_the_key_is_the_content_not_the_times(directory):
    key = content_key(directory)
    os.utime(directory / "data.txt", (1, 1))
    assert content_key(directory) == key
    (directory / "data.txt").chmod(0o600)
    assert content_key(directory) != key
