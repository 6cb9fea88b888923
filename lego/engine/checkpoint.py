"""Policy checkpoints: the seeded random-init tiny Qwen3-MoE and loading any transformers MoE checkpoint."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from lego.cache import cache_dir, content_hash
from lego.config import LegoConfig, TinyModelSpec
from lego.engine.resume_point import ResumePoint
from lego.engine.tokenizer import ensure_tokenizer, load_tokenizer
from lego.errors import ModelError
from lego.workdir import WorkDir

if TYPE_CHECKING:
    import torch

# torch is imported where a model is built or loaded: finding, checking and versioning a checkpoint (a cached run, a
# test's set-up) stays a few file reads
DTYPE_NAMES = ("bfloat16", "float16", "float32")
MARKER = "lego_model.json"


def default_model_path(config: LegoConfig, work: WorkDir) -> Path:
    return Path(config.model.path) if config.model.path else work.models / config.model.name


def weights_seed(spec: TinyModelSpec, project_seed: int) -> int:
    """The seed the initial weights are made with: the spec's own where it sets one, else the project's."""
    return project_seed if spec.seed is None else spec.seed


def copy_pretrained_fingerprint(spec: TinyModelSpec, seed: int) -> str:
    """What the weights before code copying depend on: the spec, the seed and, when it runs, copy pretraining's code."""
    seed = weights_seed(spec, seed)
    if not spec.copy_pretraining.enabled:
        return content_hash(spec.model_dump_json(exclude={"seed", "copy_pretraining", "code_copying"}), str(seed))
    return content_hash(spec.model_dump_json(exclude={"seed", "code_copying"}), str(seed), copy_pretraining_source(),
                        resume_point_source())


def tiny_model_fingerprint(spec: TinyModelSpec, seed: int) -> str:
    """What the initial weights depend on: those before code copying and, when it runs, its settings, code and the
    source it reads."""
    before = copy_pretrained_fingerprint(spec, seed)
    if not spec.code_copying.enabled:
        return before
    from lego.engine.code_copying import corpus_digest, standard_library_files

    return content_hash(before, spec.code_copying.model_dump_json(), code_copying_source(), resume_point_source(),
                        corpus_digest(standard_library_files()))


def copy_pretraining_source() -> str:
    return Path(__file__).with_name("copy_pretraining.py").read_text()


def code_copying_source() -> str:
    return Path(__file__).with_name("code_copying.py").read_text()


def resume_point_source() -> str:
    return Path(__file__).with_name("resume_point.py").read_text()


def copy_pretrained_cache(fingerprint: str) -> Path:
    """Where a copy-pretrained checkpoint (and, keyed by its own fingerprint, the code-copied one made from it) is
    kept for the whole machine: they take about an hour on 2 cores, and every work directory (each bench seed's, each
    arm's) starts from them."""
    return cache_dir("copy-pretrained") / fingerprint


@contextlib.contextmanager
def making(cached: Path, on_progress: Callable[[str], None] | None) -> Iterator[None]:
    """Held while this process makes the machine's checkpoint `cached`. Another process that needs the same one (a
    second work dir, a `lego eval` beside a bench) waits for it, then finds it made, instead of training it again
    beside the first: both would write the one resume point. An exclusive `flock`, which the kernel releases when
    its process dies, so a killed maker never leaves it held."""
    lock = cached.with_name(cached.name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            (on_progress or (lambda line: None))(f"policy: {holder} is making {cached}; waiting for it")
            fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        handle.truncate()
        handle.write(f"process {os.getpid()}")
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def resume_point(cached: Path, on_progress: Callable[[str], None] | None) -> ResumePoint:
    """Where the loop that makes the machine's checkpoint `cached` keeps its resume point: beside it, under the same
    fingerprint, so that only the same spec, seed and code resume from it."""
    return ResumePoint(cached.with_name(cached.name + ".resume.pt"), on_progress=on_progress)


def init_tiny_model(spec: TinyModelSpec, out: Path, seed: int = 0, force: bool = False,
                    on_progress: Callable[[str], None] | None = None) -> Path:
    """Write a random-init Qwen3-MoE checkpoint with the real Qwen3 tokenizer, copy-pretrained and trained to copy
    code when the spec says so (`on_progress` gets their progress lines); same spec and seed, same weights. `seed` is
    the project's; the spec's own seed, where set, wins."""
    seed = weights_seed(spec, seed)
    fingerprint = tiny_model_fingerprint(spec, seed)
    marker = out / MARKER
    if marker.exists() and not force:
        if json.loads(marker.read_text()).get("fingerprint") == fingerprint:
            return out  # before importing transformers: a rerun's set-up only checks
    code_copied = copy_pretrained_cache(fingerprint)  # the machine's copy: every work dir of a shared base reads it
    with making(code_copied, on_progress) if spec.code_copying.enabled else contextlib.nullcontext():
        if spec.code_copying.enabled and not force and _marks(code_copied, fingerprint):
            (on_progress or (lambda line: None))(f"policy: code copying: cached at {code_copied}")
            _copy_whole(code_copied, out)
            return out
        return _build(spec, out, seed, fingerprint, code_copied, force, on_progress)


def _build(spec: TinyModelSpec, out: Path, seed: int, fingerprint: str, code_copied: Path, force: bool,
           on_progress: Callable[[str], None] | None) -> Path:
    tokenizer = load_tokenizer(ensure_tokenizer())
    if spec.copy_pretraining.enabled:
        model, measured = _copy_pretrained(spec, seed, tokenizer, force, on_progress)
    else:
        model, measured = _random_init(spec, seed, tokenizer), {}
    marker_fields = {"fingerprint": fingerprint, "seed": seed, "spec": spec.model_dump(), "policy_version": 0}
    if spec.code_copying.enabled:
        from lego.engine.code_copying import train_code_copying

        resume = resume_point(code_copied, on_progress)
        if force:
            resume.clear()
        measured |= train_code_copying(model, tokenizer, spec.code_copying, seed, on_progress=on_progress,
                                       resume=resume)
        _save(model, tokenizer, code_copied, marker_fields | measured)
        resume.clear()
    _save(model, tokenizer, out, marker_fields | measured)
    return out


def _marks(directory: Path, fingerprint: str) -> bool:
    marker = directory / MARKER
    return marker.exists() and json.loads(marker.read_text()).get("fingerprint") == fingerprint


def _copy_whole(source: Path, out: Path) -> None:
    """Written whole or not at all, as _save writes."""
    partial = out.with_name(out.name + ".partial")
    for stale in (partial, out):
        if stale.exists():
            shutil.rmtree(stale)
    shutil.copytree(source, partial)
    partial.rename(out)


def _random_init(spec: TinyModelSpec, seed: int, tokenizer):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    model_config = Qwen3MoeConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        moe_intermediate_size=spec.moe_intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        num_experts=spec.num_experts,
        num_experts_per_tok=spec.num_experts_per_tok,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
    )
    import torch

    torch.manual_seed(seed)
    return Qwen3MoeForCausalLM(model_config)


def _copy_pretrained(spec: TinyModelSpec, seed: int, tokenizer, force: bool,
                     on_progress: Callable[[str], None] | None) -> tuple[object, dict]:
    """The copy-pretrained model and what its pretraining measured: from the machine's cache, else trained and kept."""
    fingerprint = copy_pretrained_fingerprint(spec, seed)
    cached = copy_pretrained_cache(fingerprint)
    with making(cached, on_progress):
        return _load_or_pretrain(spec, seed, tokenizer, force, on_progress, fingerprint, cached)


def _load_or_pretrain(spec: TinyModelSpec, seed: int, tokenizer, force: bool,
                      on_progress: Callable[[str], None] | None, fingerprint: str,
                      cached: Path) -> tuple[object, dict]:
    if _marks(cached, fingerprint) and not force:
        (on_progress or (lambda line: None))(f"policy: copy pretraining: cached at {cached}")
        recorded = json.loads((cached / MARKER).read_text())
        measured = {key: value for key, value in recorded.items() if key.startswith("copy_")}
        return load_model(cached, "float32").train(), measured
    from lego.engine.copy_pretraining import pretrain_copying

    model = _random_init(spec, seed, tokenizer)
    resume = resume_point(cached, on_progress)
    if force:
        resume.clear()
    measured = pretrain_copying(model, spec.copy_pretraining, seed, on_progress, resume=resume)
    _save(model, tokenizer, cached, {"fingerprint": fingerprint, "seed": seed, "spec": spec.model_dump(),
                                     "policy_version": 0, **measured})
    resume.clear()
    return model, measured


def _save(model, tokenizer, out: Path, marker: dict) -> None:
    """Written whole or not at all: a half-written directory is never mistaken for a checkpoint."""
    if out.exists():
        shutil.rmtree(out)
    partial = out.with_name(out.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    (partial / MARKER).write_text(json.dumps(marker, indent=2))
    partial.rename(out)


def load_model(path: Path, dtype: str = "float32", device: str = "cpu"):
    import torch
    from transformers import AutoModelForCausalLM

    if not (path / "config.json").is_file():
        raise ModelError(f"no transformers checkpoint at {path}; run `lego model init` or set model.path")
    if dtype not in DTYPE_NAMES:
        raise ModelError(f"unknown model dtype {dtype!r}; choose one of {', '.join(DTYPE_NAMES)}")
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype))
    return model.to(device).eval()


def moe_routers(model) -> list[torch.nn.Module]:
    """The router (gate) of every sparse MoE layer, in layer order."""
    routers = []
    for layer in model.model.layers:
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None and hasattr(gate, "weight") and getattr(gate, "top_k", None) is not None:
            routers.append(gate)
    return routers


def policy_version(path: Path) -> int:
    marker = path / MARKER
    if marker.exists():
        return int(json.loads(marker.read_text()).get("policy_version", 0))
    return 0
