"""The embedded stack: Docker engine bootstrap, base image, tokenizer, tiny policy."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

NETWORK_PROBE = r"""
import socket, sys
errors = []
for host, port in (("1.1.1.1", 53), ("8.8.8.8", 443), ("pypi.org", 443)):
    try:
        socket.create_connection((host, port), timeout=3)
        print("CONNECTED", host)
        sys.exit(1)
    except OSError as exc:
        errors.append(type(exc).__name__)
print("NO-NETWORK", ",".join(errors))
"""


@pytest.mark.docker
def test_container_runs_with_network_none_and_cannot_reach_the_network(docker_engine, base_image):
    output = docker_engine.client.containers.run(
        base_image, ["python3", "-c", NETWORK_PROBE], network_mode="none", remove=True
    ).decode()
    assert "NO-NETWORK" in output and "CONNECTED" not in output
    interfaces = docker_engine.client.containers.run(
        base_image, ["ls", "/sys/class/net"], network_mode="none", remove=True
    ).decode().split()
    assert interfaces == ["lo"]


@pytest.mark.docker
def test_the_engine_client_waits_longer_than_the_ping_that_found_it(docker_engine):
    # The engine is found by a 5-second ping. On a loaded machine creating or starting a container takes longer than
    # that, and a call cut short is graded an infra error (it was, for two grading tests, with a run beside them).
    from lego.sandbox.daemon import API_TIMEOUT

    assert docker_engine.client.api.timeout == API_TIMEOUT >= 120
    assert docker_engine.client.ping()


@pytest.mark.docker
def test_base_image_has_the_sandbox_tools(docker_engine, base_image):
    output = docker_engine.client.containers.run(
        base_image,
        ["sh", "-c", "python3 -m pytest --version 2>&1; git --version; socat -V | head -1; git config user.name"],
        network_mode="none", remove=True,
    ).decode()
    assert "pytest" in output and "git version" in output and "socat" in output and "lego" in output


@pytest.mark.docker
def test_base_image_is_reused_when_recipe_is_unchanged(docker_engine, base_image, lego_config):
    from lego.sandbox import image as image_module

    before = docker_engine.client.images.get(base_image).id
    calls = []
    original = image_module.rootfs_tarball
    image_module.rootfs_tarball = lambda *a, **k: calls.append(1) or original(*a, **k)
    try:
        again = image_module.ensure_base_image(docker_engine.client, lego_config.docker)
    finally:
        image_module.rootfs_tarball = original
    assert again == base_image
    assert docker_engine.client.images.get(again).id == before
    assert calls == []  # nothing rebuilt, nothing re-imported


def test_recipe_change_changes_the_tag(lego_config):
    from lego.sandbox.image import base_image_tag

    changed = lego_config.docker.model_copy(update={"base_image_packages": [*lego_config.docker.base_image_packages, "jq"]})
    reordered = lego_config.docker.model_copy(update={"base_image_packages": list(reversed(lego_config.docker.base_image_packages))})
    assert base_image_tag(changed) != base_image_tag(lego_config.docker)
    assert base_image_tag(reordered) == base_image_tag(lego_config.docker)


@pytest.mark.docker
@pytest.mark.skipif(os.geteuid() != 0 or not sys.platform.startswith("linux"), reason="private dockerd needs root on Linux")
def test_private_dockerd_starts_runs_a_container_and_stops(tmp_path_factory, lego_config):
    from lego.cache import cache_dir
    from lego.sandbox.daemon import PrivateDockerd, docker_engine, ping

    root = tmp_path_factory.mktemp("dockerd")
    with docker_engine(root, host="unix:///nonexistent.sock") as engine:
        # A user engine may answer on the default socket; only then is no private daemon started.
        if engine.private:
            assert engine.owned
            assert engine.base_url == PrivateDockerd(root).base_url
            assert (root / "dockerd.pid").exists()
            tarball = next(iter(sorted(cache_dir("rootfs").glob("*.tar"))))
            with open(tarball, "rb") as data:
                engine.client.api.import_image_from_data(data, repository="lego-bootstrap-probe", tag="t")
            out = engine.client.containers.run("lego-bootstrap-probe:t", ["ls", "/sys/class/net"],
                                               network_mode="none", remove=True).decode().split()
            assert out == ["lo"]
        base_url = engine.base_url
        private = engine.private
    if private:
        assert ping(base_url, timeout=2) is None
        assert PrivateDockerd(root).running_pid() is None


def test_unreachable_engine_without_permission_says_what_to_install(tmp_path, monkeypatch):
    from lego.errors import DockerUnavailableError
    from lego.sandbox import daemon

    monkeypatch.setattr(daemon, "DEFAULT_SOCKETS", ())
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    with pytest.raises(DockerUnavailableError, match="docker.io"):
        daemon.connect(tmp_path, host="unix:///nonexistent.sock", start_private=False)


def test_tokenizer_is_verified_and_round_trips_a_chat_with_tools(tokenizer_dir):
    from lego.engine.tokenizer import load_tokenizer, verify

    assert verify(tokenizer_dir) == []
    tokenizer = load_tokenizer(tokenizer_dir)
    assert len(tokenizer) == 151669
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == 151645
    tools = [{"type": "function", "function": {"name": "bash", "description": "Run a command",
                                               "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                                                              "required": ["command"]}}}]
    messages = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing test in calc.py"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "bash", "arguments": {"command": "pytest -q"}}}]},
        {"role": "tool", "content": "1 failed"},
    ]
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert "<tools>" in text and '"name": "bash"' in text
    assert "<tool_call>" in text and "<tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert 151657 in ids  # <tool_call> is one special token


def test_tokenizer_checksum_mismatch_is_detected(tmp_path):
    from lego.engine.tokenizer import verify

    (tmp_path / "tokenizer.json").write_text("{}")
    assert set(verify(tmp_path)) == {"tokenizer.json", "tokenizer_config.json"}


def test_tiny_model_is_seeded_loads_generates_and_exposes_routers(tiny_model_path, tmp_path, lego_config):
    from lego.engine.checkpoint import init_tiny_model, load_model, moe_routers
    from lego.engine.tokenizer import load_tokenizer

    model = load_model(tiny_model_path, "float32")
    spec = lego_config.model.init
    assert model.config.num_experts == spec.num_experts and model.config.norm_topk_prob is True
    routers = moe_routers(model)
    assert len(routers) == spec.num_hidden_layers
    picked = []
    hooks = [router.register_forward_hook(lambda m, i, o: picked.append(o[2])) for router in routers]
    tokenizer = load_tokenizer(tiny_model_path)
    ids = tokenizer("def add(a, b):", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=5, do_sample=False)
    for hook in hooks:
        hook.remove()
    assert out.shape[1] == ids.shape[1] + 5
    assert picked and picked[0].shape[-1] == spec.num_experts_per_tok
    assert int(picked[0].max()) < spec.num_experts

    # Same spec and seed: identical weights.
    other = init_tiny_model(spec, tmp_path / "again", seed=lego_config.project.seed)
    twin = load_model(other, "float32")
    for (name, a), (_, b) in zip(model.state_dict().items(), twin.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_cli_help_lists_the_pipeline_commands():
    result = subprocess.run([sys.executable, "-m", "lego_cli", "--help"], capture_output=True, text=True,
                            env={**os.environ, "COLUMNS": "200"})
    assert result.returncode == 0
    for command in ("setup", "doctor", "run", "stage", "tasks", "data", "deploy", "compare", "bench", "model"):
        assert command in result.stdout
