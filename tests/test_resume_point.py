"""The base model's copy pretraining and code copying resume after their process dies (lego/engine/resume_point.py):
stopped right after any of its saves (in the short phase, at the phase change, in the long phase, in code copying),
`init_tiny_model` run again picks up there and writes the very weights an uninterrupted run writes."""

from __future__ import annotations

import json

import pytest
import torch
from fixtures_model import TINY

from lego.config import CodeCopyingSpec, CopyPretrainingSpec, TinyModelSpec
from lego.engine import checkpoint
from lego.engine import code_copying as code_module
from lego.engine import copy_pretraining as copy_module
from lego.engine.checkpoint import (
    MARKER,
    copy_pretrained_fingerprint,
    init_tiny_model,
    tiny_model_fingerprint,
)
from lego.engine.code_copying import standard_library_files
from lego.engine.resume_point import ResumePoint

SPEC = TinyModelSpec(**TINY, copy_pretraining=CopyPretrainingSpec(
    enabled=True, short_steps=16, long_steps=12, ramp_steps=4, max_length=256, short_target=0.5, long_target=0.5),
    code_copying=CodeCopyingSpec(enabled=True, min_steps=2, max_steps=8, max_length=256, target=1.0))


class Killed(Exception):
    """The process died right after a save: what is on disk is all the next run finds."""


class RecordedResumePoint(ResumePoint):
    """Saves at every check (every_s=0), records where, and dies after the `die_after`th save when given."""

    saves: list[str] = []
    die_after: int | None = None

    def save(self, state: dict) -> None:
        super().save(state)
        RecordedResumePoint.saves.append(f"{state.get('phase', 'code')}:{state['step']}")
        if len(RecordedResumePoint.saves) == RecordedResumePoint.die_after:
            raise Killed


@pytest.fixture
def small_loops(tmp_path, monkeypatch):
    """Small steps and checks every 2 steps. A check's verdict is drawn from the rows it measures on, so where each
    phase stops depends on the row generators' state exactly: a resume that lost it would stop elsewhere."""
    for module in (copy_module, code_module):
        monkeypatch.setattr(module, "CHECK_EVERY", 2)
        monkeypatch.setattr(module, "SHORT_ROWS", 4)
    monkeypatch.setattr(copy_module, "TOKENS_PER_LONG_STEP", 512)
    monkeypatch.setattr(copy_module, "CANDIDATES", 256)
    monkeypatch.setattr(code_module, "TOKENS_PER_STEP", 512)
    monkeypatch.setattr(code_module, "standard_library_files", lambda root=None: standard_library_files()[:40])
    real = copy_module.copy_loss

    def judged(model, batch, rows=None):
        if rows is not None:  # a training step: the real loss
            return real(model, batch, rows)
        return torch.tensor(0.0), float(int(batch[0][0, 0]) % 4 == 0)

    monkeypatch.setattr(copy_module, "copy_loss", judged)
    monkeypatch.setattr(code_module, "copy_loss", judged)
    monkeypatch.setattr(checkpoint, "resume_point", lambda cached, on_progress: RecordedResumePoint(
        cached.with_name(cached.name + ".resume.pt"), every_s=0, on_progress=on_progress))
    RecordedResumePoint.saves, RecordedResumePoint.die_after = [], None


def _made(tmp_path, monkeypatch, name: str, lines: list[str] | None = None):
    """The initial checkpoint made in work dir `name` with a machine cache of its own."""
    machine = tmp_path / f"machine-{name}"
    monkeypatch.setattr(checkpoint, "copy_pretrained_cache", lambda fingerprint: machine / fingerprint)
    lines = [] if lines is None else lines
    return init_tiny_model(SPEC, tmp_path / name / "model", seed=0, on_progress=lines.append), machine


def test_killed_after_any_save_the_base_model_resumes_to_the_uninterrupted_runs_weights(
        tmp_path, monkeypatch, small_loops):
    whole, machine = _made(tmp_path, monkeypatch, "whole")
    saves = list(RecordedResumePoint.saves)
    # the seed and the verdicts give every kind of save: in the short phase, at the change, in the long phase, code
    change = saves.index("long:0")
    assert saves[change - 1].startswith("short:") and saves[change + 1].startswith("long:") and saves[-1].startswith(
        "code:"), saves
    assert not list(machine.glob("*.resume.pt*"))  # the resume points go once their checkpoints are written
    expected = json.loads((whole / MARKER).read_text())
    weights = (whole / "model.safetensors").read_bytes()

    for die_after in (change - 1, change, change + 1, len(saves) - 1):
        name = f"killed-at-{saves[die_after]}"
        RecordedResumePoint.saves, RecordedResumePoint.die_after = [], die_after + 1
        with pytest.raises(Killed):
            _made(tmp_path, monkeypatch, name)
        assert not (tmp_path / name / "model").exists()
        RecordedResumePoint.saves, RecordedResumePoint.die_after = [], None
        lines: list[str] = []
        resumed, _ = _made(tmp_path, monkeypatch, name, lines)
        assert any(f"resumed at step {saves[die_after].split(':')[1]}" in line for line in lines), (name, lines)
        assert (resumed / "model.safetensors").read_bytes() == weights, name
        marker = json.loads((resumed / MARKER).read_text())
        timings = {key for key in marker if key.endswith("_seconds")}
        assert {k: v for k, v in marker.items() if k not in timings} == {
            k: v for k, v in expected.items() if k not in timings}, name
        # it did only what was left: the saves after the one it resumed from
        assert RecordedResumePoint.saves == saves[die_after + 1:], name


def test_a_damaged_resume_point_is_said_and_started_over(tmp_path):
    point = ResumePoint(tmp_path / "x.resume.pt")
    point.path.write_bytes(b"not a torch file")
    lines: list[str] = []
    point.say = lines.append
    assert point.load() is None and not point.path.exists() and "starting over" in lines[0]


def test_the_resume_point_is_in_the_cache_keys(monkeypatch):
    before = (copy_pretrained_fingerprint(SPEC, 0), tiny_model_fingerprint(SPEC, 0))
    monkeypatch.setattr(checkpoint, "resume_point_source", lambda: "changed")
    after = (copy_pretrained_fingerprint(SPEC, 0), tiny_model_fingerprint(SPEC, 0))
    assert before[0] != after[0] and before[1] != after[1]
