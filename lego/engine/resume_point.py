"""A long training loop's resume point: its whole state (weights, optimizer, phase and step, the row generators'
RNG states, the time spent), saved now and then beside the checkpoint the loop will make.

Copy pretraining and code copying take hours on 2 cores, longer than a working session: a process killed mid-way
resumes from its last save instead of starting over, and, resumed, ends with the weights an uninterrupted run has.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SAVE_EVERY_S = 600.0  # a save of the family's model and its AdamW state takes seconds; a kill loses at most this

Progress = Callable[[str], None]


class ResumePoint:
    """One loop's resume file. `load` gives the saved state or None; `save` replaces it whole (a kill mid-save leaves
    the previous one); `clear` removes it once the loop's checkpoint is written."""

    def __init__(self, path: Path, every_s: float = SAVE_EVERY_S, on_progress: Progress | None = None) -> None:
        self.path = path
        self.every_s = every_s
        self.say = on_progress or (lambda line: None)
        self._saved_at = time.monotonic()

    def load(self) -> dict[str, Any] | None:
        import torch

        if not self.path.is_file():
            return None
        try:
            return torch.load(self.path, weights_only=True)
        except Exception as exc:  # damaged, or written by a torch that cannot read it back: start over
            self.say(f"policy: the resume point {self.path} cannot be read ({type(exc).__name__}: {exc}); "
                     "starting over")
            self.clear()
            return None

    def due(self) -> bool:
        return time.monotonic() - self._saved_at >= self.every_s

    def save(self, state: dict[str, Any]) -> None:
        import torch

        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(self.path.name + ".partial")
        torch.save(state, partial)
        os.replace(partial, self.path)
        self._saved_at = time.monotonic()

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)
        self.path.with_name(self.path.name + ".partial").unlink(missing_ok=True)


def rng_state(rng: random.Random) -> list:
    """A random.Random's state in types a weights-only torch.load reads back."""
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def restore_rng(rng: random.Random, state: list) -> None:
    version, internal, gauss = state
    rng.setstate((version, tuple(internal), gauss))
