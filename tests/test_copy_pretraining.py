"""Copy pretraining (lego/engine/copy_pretraining.py): the task-free rows teach only copying, the stopping rule
fails loudly, and the initial checkpoint's cache key covers the pretraining exactly when it runs. That copying
forms on the family's model is measured, not tested: docs/benchmarks.md#learning-bench (15-30 minutes)."""

from __future__ import annotations

import json

import pytest
import torch
from fixtures_model import TINY

from lego.cache import content_hash
from lego.config import CopyPretrainingSpec, TinyModelSpec
from lego.engine import checkpoint
from lego.engine.checkpoint import MARKER, init_tiny_model, tiny_model_fingerprint
from lego.engine.copy_pretraining import CopyPretrainingError, CopyRows, copy_loss, long_row_length


def _earlier_pairs(row: list[int], position: int) -> set[tuple[int, int]]:
    return {(row[index - 1], row[index]) for index in range(1, position - 1)}


def test_every_target_is_what_followed_its_previous_token_earlier_in_the_row():
    rows = CopyRows(seed=3, vocab_end=151_643)
    for ids, targets in (rows.repeated_halves(8), rows.recurring_spans(4, 600, 6)):
        assert targets
        for row, position in targets:
            tokens = ids[row].tolist()
            # copying predicts it: the (previous, target) pair occurred before, so attending to it gives the answer
            assert (tokens[position - 1], tokens[position]) in _earlier_pairs(tokens, position)
        assert int(ids.min()) >= 100 and int(ids.max()) < 151_643  # ordinary ids, none of Qwen3's special tokens


def test_rows_are_seeded_and_lengths_grow_to_the_cap_without_leaving_short_rows_out():
    first, again = CopyRows(seed=5, vocab_end=151_643), CopyRows(seed=5, vocab_end=151_643)
    assert torch.equal(first.recurring_spans(2, 300, 3)[0], again.recurring_spans(2, 300, 3)[0])
    spec = CopyPretrainingSpec(max_length=1600, ramp_steps=100)
    lengths = [long_row_length(step, spec, first.rng) for step in range(1, 2000)]
    assert max(lengths[:10]) < 400 and max(lengths) == pytest.approx(1600, abs=40) and min(lengths[1000:]) < 400


def test_the_loss_is_on_the_copied_tokens_and_the_sampled_softmax_holds_the_targets():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(vocab_size=151_669, **TINY, tie_word_embeddings=True))
    rows = CopyRows(seed=0, vocab_end=151_643)
    batch = rows.repeated_halves(4)
    sampled, _ = copy_loss(model, batch, rows)
    full, accuracy = copy_loss(model, batch)
    # a random init: about uniform over the candidates (~8k) and over the vocabulary (~151k)
    assert 8.0 < float(sampled.detach()) < 10.0 and 11.0 < float(full.detach()) < 13.0 and accuracy < 0.05


def test_a_model_that_never_learns_to_copy_fails_with_what_to_change(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint, "copy_pretrained_cache", lambda fingerprint: tmp_path / "machine" / fingerprint)
    # A check every 5 steps, not 50: five steps are as far from the plateau's end as fifty, at a tenth of the time.
    monkeypatch.setattr("lego.engine.copy_pretraining.CHECK_EVERY", 5)
    spec = TinyModelSpec(**TINY, copy_pretraining=CopyPretrainingSpec(enabled=True, short_steps=5))
    lines: list[str] = []
    with pytest.raises(CopyPretrainingError, match="model.init.copy_pretraining.short_steps"):
        init_tiny_model(spec, tmp_path / "model", seed=0, on_progress=lines.append)
    assert not (tmp_path / "model").exists()  # nothing half-made is left to be mistaken for a checkpoint


def test_the_cache_key_covers_copy_pretraining_only_when_it_runs(tmp_path, monkeypatch):
    plain = TinyModelSpec(**TINY)
    # the key a random init had before copy pretraining existed: its checkpoints stay valid
    before = content_hash(plain.model_dump_json(exclude={"seed", "copy_pretraining", "code_copying"}), "0")
    assert tiny_model_fingerprint(plain, 0) == before
    assert tiny_model_fingerprint(plain.model_copy(update={"copy_pretraining": CopyPretrainingSpec(short_steps=7)}),
                                  0) == before  # its settings do not matter while it is off
    on = TinyModelSpec(**TINY, copy_pretraining=CopyPretrainingSpec(enabled=True))
    longer = TinyModelSpec(**TINY, copy_pretraining=CopyPretrainingSpec(enabled=True, max_length=2048))
    assert len({before, tiny_model_fingerprint(on, 0), tiny_model_fingerprint(on, 1),
                tiny_model_fingerprint(longer, 0)}) == 4

    import lego.engine.copy_pretraining as module

    calls: list[int] = []

    def pretend(model, settings, seed, on_progress=None, resume=None):  # a test double beside the real run above
        calls.append(seed)
        return {"copy_accuracy_long": 0.9}

    monkeypatch.setattr(module, "pretrain_copying", pretend)
    # the copy-pretrained checkpoint is kept for the machine: here, for this test only
    monkeypatch.setattr(checkpoint, "copy_pretrained_cache", lambda fingerprint: tmp_path / "machine" / fingerprint)
    path = init_tiny_model(on, tmp_path / "model", seed=0)
    marker = json.loads((path / MARKER).read_text())
    assert marker["fingerprint"] == tiny_model_fingerprint(on, 0) and marker["copy_accuracy_long"] == 0.9
    init_tiny_model(on, tmp_path / "model", seed=0)  # cached: the marker matches
    assert calls == [0]
    monkeypatch.setattr("lego.engine.checkpoint.copy_pretraining_source", lambda: "changed code")
    assert tiny_model_fingerprint(on, 0) != marker["fingerprint"]  # its code changed: the checkpoint is redone
