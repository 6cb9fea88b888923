"""Induction pretraining of the family's random-init policy on task-free rows (docs/benchmarks.md, "Learning bench").

An experiment's reproduction, not yet a pipeline step: can the family's model (configs/family.yaml's spec) learn
to copy a span by content, the skill a warm start needs in order to write a held-out fix? Each training row is a
random half of 16 to 64 token ids (drawn from [100, POOL)), that half again, then random ids to 128 tokens; the
loss is on each repeat's tokens after its first, over the targets and 8,192 drawn ids. Every 50 steps it prints one
JSON line of argmax copy accuracy (the whole vocabulary) on fresh rows: `repeats` (the training exercise), `spans`
(two 8-24-token spans recurring at random places: only content tells where), `unseen` (spans of ids never drawn),
`long` (spans recurring 1,000+ tokens later in 1,600-token rows).

    .venv/bin/python scripts/induction_pretraining.py [steps=1500] [seed=0] [pool=30000] [lr=3e-3] [out=PATH]
"""

from __future__ import annotations

import json
import random
import sys
import time

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from lego.config import load_config

ROW = 128
CANDIDATES = 8192
VOCAB = 151_669


def main(argv: list[str]) -> None:
    options = {"steps": "1500", "seed": "0", "pool": "30000", "lr": "3e-3", "out": ""}
    options.update(arg.split("=", 1) for arg in argv)
    steps, seed, pool, lr = int(options["steps"]), int(options["seed"]), int(options["pool"]), float(options["lr"])
    torch.set_num_threads(2)
    spec = load_config("family").model.init
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        moe_intermediate_size=spec.moe_intermediate_size, num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads, num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim, num_experts=spec.num_experts, num_experts_per_tok=spec.num_experts_per_tok,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=True))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    rows = Rows(seed, pool)
    started = time.monotonic()
    for step in range(1, steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = lr * min(1.0, step / 100)
        loss, _ = copy_loss(model, *rows.repeats(64), rows)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 50 == 0 or step == steps:
            with torch.no_grad():
                measured = {"repeats": copy_loss(model, *rows.repeats(16))[1],
                            "spans": copy_loss(model, *rows.spans(8, ROW))[1],
                            "unseen": copy_loss(model, *rows.spans(8, ROW, low=pool, high=VOCAB - 30))[1],
                            "long": copy_loss(model, *rows.spans(2, 1600, far=True))[1]}
            print(json.dumps({"step": step, "seconds": round(time.monotonic() - started), "loss": round(float(loss.detach()), 3),
                              **{name: round(value, 3) for name, value in measured.items()}}), flush=True)
    if options["out"]:
        torch.save(model.state_dict(), options["out"])


class Rows:
    """Seeded rows of random ids with copies in them; each row's targets as (row, position) pairs."""

    def __init__(self, seed: int, pool: int) -> None:
        self.rng, self.generator, self.pool = random.Random(seed), torch.Generator().manual_seed(seed), pool

    def ids(self, shape: tuple[int, ...], low: int = 100, high: int | None = None) -> torch.Tensor:
        return torch.randint(low, high or self.pool, shape, generator=self.generator)

    def repeats(self, count: int):
        half = self.rng.randint(16, 64)
        first = self.ids((count, half))
        rows = torch.cat([first, first, self.ids((count, ROW - 2 * half))], dim=1)
        return rows, [(row, position) for row in range(count) for position in range(half + 1, 2 * half)]

    def spans(self, count: int, length: int, low: int = 100, high: int | None = None, far: bool = False):
        rows, targets = self.ids((count, length), low, high), []
        for row in range(count):
            for _ in range(2):
                size = self.rng.randint(8, 24)
                source = self.rng.randint(0, length // 3 if far else length // 2 - size)
                copy = self.rng.randint(max(source + size, length - 300) if far else length // 2, length - size)
                rows[row, copy:copy + size] = rows[row, source:source + size]
                targets += [(row, position) for position in range(copy + 1, copy + size)]
        return rows, targets


def copy_loss(model, ids: torch.Tensor, targets: list[tuple[int, int]], rows: Rows | None = None):
    """The targets' cross-entropy (over CANDIDATES drawn ids when `rows` is given, else the whole vocabulary) and
    the share ranked first."""
    hidden = model.model(input_ids=ids).last_hidden_state
    row_index = torch.tensor([row for row, _ in targets])
    position = torch.tensor([position for _, position in targets])
    states, wanted = hidden[row_index, position - 1], ids[row_index, position]
    if rows is None:
        logits = model.lm_head(states)
        return (torch.nn.functional.cross_entropy(logits, wanted),
                float((logits.argmax(-1) == wanted).float().mean()))
    candidates = torch.unique(torch.cat([wanted, rows.ids((CANDIDATES,))]))
    logits = states @ model.lm_head.weight[candidates].T
    index = torch.searchsorted(candidates, wanted)
    return torch.nn.functional.cross_entropy(logits, index), float((logits.argmax(-1) == index).float().mean())


if __name__ == "__main__":
    main(sys.argv[1:])
