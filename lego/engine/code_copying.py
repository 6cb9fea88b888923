"""Copying in real code, after copy pretraining: rows of the Python standard library's source in which spans recur.

Copy pretraining's rows are random ids, each id rare, so one earlier occurrence of the current token says what comes
next. In a statement and a fix the tokens that matter (`/`, `_`, `def`, ` return`, digits) recur everywhere, and the
copy must follow the longer context that is unique. From a model that copied 90% of random spans, a warm start
wrote 1 of 32 held-out fixes; after this phase (600 steps, spans of code copied 44% -> 78%), the same warm start
wrote 9 of 32 and their probability at temperature 1 rose tenfold (docs/benchmarks.md, Learning bench, item 8).
The source is the interpreter's own standard library: on every machine, no download, no task in it.

The loss is on the recurring spans' tokens only, as in copy pretraining, with short random-id repeats kept in each
step; the phase stops, after `min_steps`, once the spans of held-out files in `max_length`-token rows are copied at
`target` (argmax over the whole vocabulary, every CHECK_EVERY steps), or at `max_steps`. Given a ResumePoint, it saves
its state every SAVE_EVERY_S and resumes from it, as copy pretraining does.
"""

from __future__ import annotations

import random
import sysconfig
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lego.cache import content_hash
from lego.config import CodeCopyingSpec
from lego.engine.copy_pretraining import (
    CHECK_EVERY,
    SHORT_ROW,
    SHORT_ROWS,
    CopyRows,
    Progress,
    copy_loss,
    plant_copies,
)
from lego.engine.resume_point import ResumePoint, restore_rng, rng_state
from lego.errors import ModelError

if TYPE_CHECKING:
    import torch

# Packages of the standard library that are tests, demos, or bundled wheels rather than library code
LEFT_OUT = frozenset({"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "turtledemo",
                      "ensurepip", "__pycache__"})
MEASURED_FILE_EVERY = 10  # every tenth file (sorted by path) is only measured on, never trained on
TOKENS_PER_STEP = 4096
WARMUP = 50


class CodeCorpusError(ModelError):
    """The interpreter's standard library has no Python source to copy from."""


def standard_library_files(root: Path | None = None) -> list[Path]:
    """The standard library's own modules, sorted by path."""
    root = root or Path(sysconfig.get_paths()["stdlib"])
    files = sorted(path for path in root.rglob("*.py")
                   if not LEFT_OUT & set(path.relative_to(root).parts[:-1]))
    if len(files) < 2 * MEASURED_FILE_EVERY:
        raise CodeCorpusError(
            f"{root} holds {len(files)} Python source files: code copying reads the standard library's source, "
            "which this interpreter ships compiled only; use a Python with its source (python.org, pyenv, Debian's "
            "libpython3.11-stdlib), or turn model.init.code_copying off")
    return files


def corpus_digest(files: list[Path]) -> str:
    """What the phase's rows depend on beyond its code: the source it reads (it differs between Python releases)."""
    return content_hash(*(path.name + ":" + content_hash(path.read_bytes().decode("utf-8", "replace"))
                          for path in files))


class CodeRows:
    """Seeded windows of tokenized source with spans recurring: (ids, targets) as CopyRows gives them."""

    def __init__(self, files: list[Path], tokenizer, seed: int) -> None:
        self.rng = random.Random(f"code-copying:{seed}")
        train, measured = [], []
        for index, path in enumerate(files):
            ids = tokenizer.encode(path.read_text(encoding="utf-8", errors="replace"), verbose=False)
            (measured if index % MEASURED_FILE_EVERY == 0 else train).extend(ids)
        self.train, self.measured = train, measured

    def spans(self, count: int, length: int, spans: int, measured: bool = False
              ) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        """`count` windows of `length` tokens in which up to `spans` spans of 8 to 32 tokens from the first half
        recur in the second, no copy over another; the targets are the copies' tokens after their first."""
        import torch

        source = self.measured if measured else self.train
        if len(source) <= length:
            raise CodeCorpusError(f"the code corpus has {len(source)} tokens, fewer than a {length}-token row")
        rows, targets = [], []
        for row in range(count):
            start = self.rng.randint(0, len(source) - length)
            rows.append(torch.tensor(source[start:start + length]))
            targets += plant_copies(rows[-1], spans, self.rng, row)
        return torch.stack(rows), targets


def train_code_copying(model, tokenizer, spec: CodeCopyingSpec, seed: int, files: list[Path] | None = None,
                       on_progress: Progress | None = None, resume: ResumePoint | None = None) -> dict[str, Any]:
    """Train `model` in place on code rows (module docstring); what it measured, for the checkpoint's marker."""
    import torch

    say = on_progress or (lambda line: None)
    code = CodeRows(files or standard_library_files(), tokenizer, seed)
    random_rows = CopyRows(seed + 1, model.config.vocab_size - 26)  # above: Qwen3's special tokens
    saved = resume.load() if resume else None
    if saved:
        model.load_state_dict(saved["model"])
        restore_rng(code.rng, saved["code_rng"])
        random_rows.restore(saved["rows"])
        torch.set_rng_state(saved["torch_rng"])
        say(f"policy: code copying: resumed at step {saved['step']} ({saved['elapsed']:.0f} s done) from "
            f"{resume.path}")
    started = time.monotonic() - (saved["elapsed"] if saved else 0.0)

    def measured() -> float:
        model.eval()
        with torch.no_grad():
            accuracy = copy_loss(model, code.spans(8, spec.max_length, 4, measured=True))[1]
        model.train()
        return accuracy

    if saved:
        accuracy_before, accuracy, steps = saved["accuracy_before"], saved["accuracy"], saved["step"]
    else:
        accuracy_before = measured()
        accuracy, steps = accuracy_before, 0
        say(f"policy: code copying: spans of code copied {accuracy_before:.0%} before")
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.0, betas=(0.9, 0.98))
    if saved:
        optimizer.load_state_dict(saved["optimizer"])
    model.train()
    for step in range(steps + 1, spec.max_steps + 1):
        steps = step
        for group in optimizer.param_groups:
            group["lr"] = spec.lr * min(1.0, step / WARMUP)
        length = code.rng.randint(SHORT_ROW, spec.max_length)
        short = copy_loss(model, random_rows.repeated_halves(SHORT_ROWS // 2), random_rows)[0]
        spans = copy_loss(model, code.spans(max(1, TOKENS_PER_STEP // length), length, max(2, length // 100)),
                          random_rows)[0]
        optimizer.zero_grad(set_to_none=True)
        ((short + spans) / 2).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % CHECK_EVERY == 0:
            accuracy = measured()
            if step % (5 * CHECK_EVERY) == 0:
                say(f"policy: code copying: step {step}, spans of code copied {accuracy:.0%} "
                    f"({time.monotonic() - started:.0f} s)")
            if step >= spec.min_steps and accuracy >= spec.target:
                break
            if resume and resume.due():
                resume.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                             "code_rng": rng_state(code.rng), "rows": random_rows.state(),
                             "torch_rng": torch.get_rng_state(), "elapsed": time.monotonic() - started,
                             "accuracy_before": accuracy_before, "accuracy": accuracy})
    model.eval()
    reached = "" if accuracy >= spec.target else f", short of its target {spec.target:.0%}"
    say(f"policy: code copying done in {time.monotonic() - started:.0f} s: spans of code copied {accuracy:.0%} "
        f"after {steps} steps{reached}")
    return {"code_copying_steps": steps, "code_copying_accuracy_before": round(accuracy_before, 4),
            "code_copying_accuracy": round(accuracy, 4), "code_copying_seconds": round(time.monotonic() - started, 1)}
