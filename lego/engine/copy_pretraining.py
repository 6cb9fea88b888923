"""Task-free copy pretraining of the random-init policy: in-context copying, which a pretrained model brings.

A random-init model fine-tuned on a few dozen demonstrations memorizes their replies; it does not learn to take
the file, function and value its fix needs from the statement, so no RL can raise its held-out rate. Taking them
from the statement is copying: at a token, find its earlier occurrence and write what followed it (an induction
head). That circuit forms only after a long plateau, which a warm start's budget never reaches, so it is trained
here on purpose, on rows of random token ids in which spans recur; the loss is on the tokens only copying can
predict. No task, statement or demonstration is seen (docs/learning.md#copy-pretraining).

Two phases, each with a stopping rule checked every `CHECK_EVERY` steps on fresh rows (argmax over the whole
vocabulary):
- `short`: 128-token rows whose random first half (16 to 64 ids) comes again. The circuit forms here, suddenly, at
  a step that varies with the seed; the phase ends when the repeats are copied at `short_target`.
- `long`: row lengths grow to `max_length` (a harness prompt: a statement is read about a thousand tokens before
  the reply that needs it) with spans recurring at random distances, ids from the whole vocabulary, and short rows
  kept in every step; it ends when spans are copied at `long_target` in `max_length`-token rows.

Given a ResumePoint, the loop saves its state every SAVE_EVERY_S and at the phase change, and resumes from it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lego.config import CopyPretrainingSpec
from lego.engine.resume_point import ResumePoint, restore_rng, rng_state
from lego.errors import ModelError

if TYPE_CHECKING:
    import torch

FIRST_ID = 100  # below: byte pieces and punctuation
SHORT_POOL = 30_000  # the short phase draws ids below this: the circuit forms sooner on fewer distinct ids
SHORT_ROW = 128
SHORT_ROWS = 64  # per step of the short phase; the long phase keeps half of them
TOKENS_PER_LONG_STEP = 4096  # the long rows' share of a long-phase step
CANDIDATES = 8192  # the softmax's other ids per step: a 151k-way softmax would be most of a step's cost
CHECK_EVERY = 50
SHORT_WARMUP, LONG_WARMUP = 100, 50

Progress = Callable[[str], None]


class CopyPretrainingError(ModelError):
    """The random init did not learn to copy within its step budget."""


class CopyRows:
    """Seeded rows of random ids with copies in them: (ids, targets) with each target a (row, position) whose
    token only copying predicts (from position - 1)."""

    def __init__(self, seed: int, vocab_end: int) -> None:
        import torch

        self.rng = random.Random(f"copy-pretraining:{seed}")
        self.generator = torch.Generator().manual_seed(seed)
        self.vocab_end = vocab_end

    def state(self) -> dict[str, Any]:
        return {"rng": rng_state(self.rng), "generator": self.generator.get_state()}

    def restore(self, state: dict[str, Any]) -> None:
        restore_rng(self.rng, state["rng"])
        self.generator.set_state(state["generator"])

    def ids(self, shape: tuple[int, ...], end: int | None = None) -> torch.Tensor:
        import torch

        return torch.randint(FIRST_ID, end or self.vocab_end, shape, generator=self.generator)

    def repeated_halves(self, count: int, end: int | None = None) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        """`count` rows of SHORT_ROW ids: a random half of 16 to 64 ids, that half again, random ids after."""
        import torch

        half = self.rng.randint(16, 64)
        first = self.ids((count, half), end)
        rows = torch.cat([first, first, self.ids((count, SHORT_ROW - 2 * half), end)], dim=1)
        return rows, [(row, position) for row in range(count) for position in range(half + 1, 2 * half)]

    def recurring_spans(self, count: int, length: int, spans: int) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        """`count` rows of `length` random ids in which up to `spans` spans of 8 to 32 ids from the first half
        recur in the second, at any distance, no copy over another."""
        rows = self.ids((count, length))
        return rows, [target for row in range(count) for target in plant_copies(rows[row], spans, self.rng, row)]


def plant_copies(row: torch.Tensor, spans: int, rng: random.Random, row_index: int) -> list[tuple[int, int]]:
    """Copy up to `spans` spans of 8 to 32 tokens from the first half of `row` into its second half, in place, at
    any distance, no copy over another; the targets (row_index, position) are each copy's tokens after its first."""
    length, copies, targets = len(row), [], []
    for _ in range(spans):
        size = rng.randint(8, 32)
        source = rng.randint(0, length // 2 - size)
        copy = rng.randint(max(source + size, length // 2), length - size)
        if any(copy < end and start < copy + size for start, end in copies):
            continue
        copies.append((copy, copy + size))
        row[copy:copy + size] = row[source:source + size].clone()
        targets += [(row_index, position) for position in range(copy + 1, copy + size)]
    return targets


def copy_loss(model, batch: tuple[torch.Tensor, list[tuple[int, int]]],
              rows: CopyRows | None = None) -> tuple[torch.Tensor, float]:
    """The targets' cross-entropy and the share the model ranks first: over the targets and CANDIDATES drawn ids
    when `rows` is given (training), else over the whole vocabulary (measuring)."""
    import torch

    ids, targets = batch
    hidden = model.model(input_ids=ids).last_hidden_state
    row_index = torch.tensor([row for row, _ in targets])
    position = torch.tensor([position for _, position in targets])
    states, wanted = hidden[row_index, position - 1], ids[row_index, position]
    if rows is None:
        logits = model.lm_head(states)
        return torch.nn.functional.cross_entropy(logits, wanted), float((logits.argmax(-1) == wanted).float().mean())
    candidates = torch.unique(torch.cat([wanted, rows.ids((CANDIDATES,))]))
    logits = states @ model.lm_head.weight[candidates].T
    index = torch.searchsorted(candidates, wanted)
    return torch.nn.functional.cross_entropy(logits, index), float((logits.argmax(-1) == index).float().mean())


def long_row_length(step: int, spec: CopyPretrainingSpec, rng: random.Random) -> int:
    """A long-phase step's row length: drawn up to a cap that grows from SHORT_ROW to `max_length` over
    `ramp_steps`, so that every length stays in the mix."""
    cap = SHORT_ROW + (spec.max_length - SHORT_ROW) * min(1.0, step / spec.ramp_steps)
    return rng.randint(SHORT_ROW, int(cap))


def pretrain_copying(model, spec: CopyPretrainingSpec, seed: int, on_progress: Progress | None = None,
                     resume: ResumePoint | None = None) -> dict[str, Any]:
    """Train `model` in place to copy (module docstring); what it measured, for the checkpoint's marker.
    Raises CopyPretrainingError when the short phase's copying never forms within `short_steps`."""
    import torch

    say = on_progress or (lambda line: None)
    rows = CopyRows(seed, model.config.vocab_size - 26)  # above: Qwen3's special tokens
    saved = resume.load() if resume else None
    if saved:
        model.load_state_dict(saved["model"])
        rows.restore(saved["rows"])
        torch.set_rng_state(saved["torch_rng"])
        say(f"policy: copy pretraining: resumed at step {saved['step']} of the {saved['phase']} phase "
            f"({saved['elapsed']:.0f} s done) from {resume.path}")
    started = time.monotonic() - (saved["elapsed"] if saved else 0.0)
    measured: dict[str, float] = saved["measured"] if saved else {"short_accuracy": 0.0, "short_steps": 0}
    model.train()

    def measured_short() -> float:
        with torch.no_grad():
            return copy_loss(model, rows.repeated_halves(32, SHORT_POOL))[1]

    def measured_long() -> float:
        with torch.no_grad():
            return copy_loss(model, rows.recurring_spans(8, spec.max_length, 4))[1]

    def keep(phase: str, step: int, optimizer, due_only: bool = True) -> None:
        if resume and (resume.due() or not due_only):
            resume.save({"phase": phase, "step": step, "model": model.state_dict(),
                         "optimizer": optimizer.state_dict(), "rows": rows.state(), "torch_rng": torch.get_rng_state(),
                         "elapsed": time.monotonic() - started, "measured": dict(measured)})

    def optimizer_for(phase: str, lr: float):
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
        if saved and saved["phase"] == phase:
            optimizer.load_state_dict(saved["optimizer"])
        return optimizer

    if not saved or saved["phase"] == "short":
        optimizer = optimizer_for("short", spec.short_lr)
        for step in range((saved["step"] if saved else 0) + 1, spec.short_steps + 1):
            _set_lr(optimizer, spec.short_lr * min(1.0, step / SHORT_WARMUP))
            _step(model, optimizer, copy_loss(model, rows.repeated_halves(SHORT_ROWS, SHORT_POOL), rows)[0])
            if step % CHECK_EVERY == 0:
                measured |= {"short_accuracy": measured_short(), "short_steps": step}
                if step % (5 * CHECK_EVERY) == 0:
                    say(f"policy: copy pretraining, short rows: step {step}, copies {measured['short_accuracy']:.0%} "
                        f"({time.monotonic() - started:.0f} s)")
                if measured["short_accuracy"] >= spec.short_target:
                    break
                keep("short", step, optimizer)
        if measured["short_accuracy"] < spec.short_target:
            raise CopyPretrainingError(
                f"copy pretraining: after {spec.short_steps} steps of short rows the model copies "
                f"{measured['short_accuracy']:.0%} of repeats (target {spec.short_target:.0%}); the circuit forms "
                "after a plateau whose length varies with the seed: raise model.init.copy_pretraining.short_steps or "
                "try another project.seed")
        say(f"policy: copy pretraining: copying formed at step {measured['short_steps']} "
            f"({measured['short_accuracy']:.0%} of repeats)")
        optimizer = optimizer_for("long", spec.long_lr)
        measured |= {"long_accuracy": measured_long(), "long_steps": 0}
        keep("long", 0, optimizer, due_only=False)  # the short phase is most of the time: never redone
    else:
        optimizer = optimizer_for("long", spec.long_lr)
    for step in range((saved["step"] if saved and saved["phase"] == "long" else 0) + 1, spec.long_steps + 1):
        _set_lr(optimizer, spec.long_lr * min(1.0, step / LONG_WARMUP))
        length = long_row_length(step, spec, rows.rng)
        short = copy_loss(model, rows.repeated_halves(SHORT_ROWS // 2), rows)[0]
        long = copy_loss(model, rows.recurring_spans(max(1, TOKENS_PER_LONG_STEP // length), length,
                                                     max(2, length // 100)), rows)[0]
        _step(model, optimizer, (short + long) / 2)
        if step % CHECK_EVERY == 0:
            measured |= {"long_accuracy": measured_long(), "long_steps": step}
            if step % (5 * CHECK_EVERY) == 0:
                say(f"policy: copy pretraining, rows up to {spec.max_length} tokens: step {step}, copies "
                    f"{measured['long_accuracy']:.0%} ({time.monotonic() - started:.0f} s)")
            if step >= spec.ramp_steps and measured["long_accuracy"] >= spec.long_target:
                break
            keep("long", step, optimizer)
    model.eval()
    long_accuracy = measured["long_accuracy"]
    result = {"copy_short_steps": measured["short_steps"], "copy_long_steps": measured["long_steps"],
              "copy_accuracy_short": round(measured_short(), 4), "copy_accuracy_long": round(long_accuracy, 4),
              "copy_seconds": round(time.monotonic() - started, 1)}
    say(f"policy: copy pretraining done in {result['copy_seconds']:.0f} s: copies "
        f"{result['copy_accuracy_short']:.0%} of short repeats and {long_accuracy:.0%} of spans in "
        f"{spec.max_length}-token rows")
    return result


def _set_lr(optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def _step(model, optimizer, loss) -> None:
    import torch

    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
