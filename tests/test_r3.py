"""R3 routing replay on the real tiny Qwen3-MoE: forced experts, gradients, loud failures, drift share."""
# ruff: noqa: F811  (pytest fixtures imported from fixtures_model are parameters here)

from __future__ import annotations

import pytest
import torch
from fixtures_model import tiny_model_path  # noqa: F401

from lego.engine.checkpoint import load_model, moe_routers
from lego.train.replay import RoutingReplayError, record_routing, replay_routing, routing_difference_share


@pytest.fixture(scope="module")
def model(tiny_model_path):
    return load_model(tiny_model_path, "float32")


def own_routing(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad(), record_routing(model) as chosen:
        model(input_ids=ids)
    batch, seq = ids.shape
    return torch.stack([c.reshape(batch, seq, -1) for c in chosen], dim=2).to(torch.uint8)


def random_routing(model, batch: int, seq: int, seed: int = 0) -> torch.Tensor:
    routers = moe_routers(model)
    generator = torch.Generator().manual_seed(seed)
    experts, top_k = routers[0].weight.shape[0], routers[0].top_k
    picks = torch.stack([torch.randperm(experts, generator=generator)[:top_k]
                         for _ in range(batch * seq * len(routers))])
    return picks.reshape(batch, seq, len(routers), top_k).to(torch.uint8)


IDS = torch.tensor([[151644, 872, 198, 9707, 11, 1879, 0, 151645, 198, 151644, 77091, 198],
                    [151644, 872, 198, 40, 1079, 264, 1273, 13, 151645, 198, 151644, 77091]])


def test_replay_makes_every_layer_pick_the_recorded_experts(model):
    forced = random_routing(model, *IDS.shape)
    with replay_routing(model, forced), record_routing(model) as chosen:
        model(input_ids=IDS)
    assert len(chosen) == len(moe_routers(model))
    for layer, indices in enumerate(chosen):
        assert torch.equal(indices.reshape(*IDS.shape, -1), forced[:, :, layer].long())


def test_replaying_the_own_routing_changes_nothing(model):
    with torch.no_grad():
        plain = model(input_ids=IDS).logits
        with replay_routing(model, own_routing(model, IDS)):
            replayed = model(input_ids=IDS).logits
    assert torch.equal(plain, replayed)


def test_forced_routing_changes_the_output_and_the_router_keeps_gradients(model):
    forced = random_routing(model, *IDS.shape, seed=1)
    assert routing_difference_share(model, IDS, forced) > 0.5
    model.zero_grad()
    with replay_routing(model, forced):
        logits = model(input_ids=IDS).logits
    with torch.no_grad():
        plain = model(input_ids=IDS).logits
    assert not torch.allclose(logits, plain)
    logits.float().logsumexp(-1).mean().backward()
    for router in moe_routers(model):
        assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0
    model.zero_grad()


def test_replayed_weights_are_the_renormalised_softmax_at_the_forced_experts(model):
    forced = random_routing(model, *IDS.shape, seed=2)
    router = moe_routers(model)[0]
    outputs = []
    handle = router.register_forward_hook(lambda _m, inputs, output: outputs.append((inputs[0], output)))
    try:
        with torch.no_grad(), replay_routing(model, forced):
            model(input_ids=IDS)
    finally:
        handle.remove()
    hidden, (logits, scores, indices) = outputs[0]
    probs = torch.softmax(logits.float(), -1).gather(-1, indices)
    torch.testing.assert_close(scores, probs / probs.sum(-1, keepdim=True))
    torch.testing.assert_close(scores.sum(-1), torch.ones(scores.shape[0]))


def test_the_router_is_restored_after_the_block(model):
    forced = random_routing(model, *IDS.shape, seed=3)
    with replay_routing(model, forced):
        pass
    assert routing_difference_share(model, IDS, own_routing(model, IDS)) == 0.0
    assert all("forward" not in router.__dict__ for router in moe_routers(model))


def test_own_routing_has_no_drift_and_masks_count(model):
    own = own_routing(model, IDS)
    assert routing_difference_share(model, IDS, own) == 0.0
    changed = own.clone()
    changed[0, 3, 1] = torch.tensor([e for e in range(4) if e not in own[0, 3, 1].tolist()][:2], dtype=torch.uint8)
    assert routing_difference_share(model, IDS, changed) == pytest.approx(1 / IDS.numel())
    mask = torch.ones(IDS.shape, dtype=torch.bool)
    mask[0, 3] = False
    assert routing_difference_share(model, IDS, changed, mask) == 0.0


@pytest.mark.parametrize("bad", ["short", "layers", "expert", "rank"])
def test_a_misaligned_record_raises(model, bad):
    forced = random_routing(model, *IDS.shape)
    if bad == "short":
        forced = forced[:, :-1]
    elif bad == "layers":
        forced = forced[:, :, :1]
    elif bad == "expert":
        forced[0, 0, 0, 0] = 200
    else:
        forced = forced[0]
    with pytest.raises(RoutingReplayError):
        with replay_routing(model, forced):
            model(input_ids=IDS)


def test_a_forward_of_other_length_inside_the_block_raises(model):
    forced = random_routing(model, *IDS.shape)
    with pytest.raises(RoutingReplayError, match="the record must cover every token"):
        with replay_routing(model, forced):
            model(input_ids=IDS[:, :-2])
    assert all("forward" not in router.__dict__ for router in moe_routers(model))


def test_r3_benchmark_reports_the_match(lego_config, tiny_model_path, tmp_path):
    from lego.bench.r3 import bench_r3
    from lego.workdir import WorkDir

    config = lego_config.model_copy(deep=True)
    config.model.path = tiny_model_path
    result = bench_r3(config, WorkDir.create(tmp_path / "work"), trajectories=3, max_tokens=12)
    assert result["sampled_tokens"] == 36
    assert result["inference_dtype"] == "bfloat16" and result["training_dtype"] == "float32"
    assert result["with_r3"]["pearson"] >= 0.999
    assert result["with_r3"]["max_abs_diff"] < 0.05
    assert 0.0 <= result["routing_differs_share"] <= 1.0
