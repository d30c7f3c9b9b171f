"""The ILQL network and learner: targets, checkpoints, function-preserving growth, decoding, data checks."""

import pytest
import torch

from agents.ilql.data import Episode, episodes_to_arrays, validate_dataset
from agents.ilql.decode import ilql_scores, next_token_distribution
from agents.ilql.ilql import ILQL
from agents.ilql.model import ILQLModel
from evo.evolvable import remap_optimizer

from .conftest import TINY


def _batch(data, n=8):
    from agents.ilql.data import to_torch

    return to_torch({k: v[:n] for k, v in data.items()})


def _outputs(model, batch):
    model.eval()
    with torch.no_grad():
        out = model(batch["tokens"], batch["state_idxs"], batch["action_idxs"], batch["attn_mask"])
    return [out["logits"], out["vs"], *out["qs"], *out["target_qs"]]


def test_constructor_keeps_agilerl_defaults(walk_data):
    agent = ILQL(walk_data, TINY)
    assert (agent.batch_size, agent.lr, agent.alpha, agent.beta, agent.gamma, agent.tau) == (64, 1e-5, 0.005, 0.0, 0.99, 0.6)
    assert agent.double_q and agent.model.q2 is not None and agent.model.target_q2 is not None


def test_target_heads_move_by_exactly_alpha(walk_data):
    agent = ILQL(walk_data, TINY, alpha=0.25, lr=1e-2)
    before = [p.clone() for h in agent.model.target_heads() for p in h.parameters()]
    with torch.no_grad():
        for h in agent.model.q_heads():
            for p in h.parameters():
                p.add_(torch.randn_like(p))
    online = [p.clone() for h in agent.model.q_heads() for p in h.parameters()]
    agent.soft_update()
    after = [p for h in agent.model.target_heads() for p in h.parameters()]
    for b, o, a in zip(before, online, after):
        assert torch.allclose(a, 0.75 * b + 0.25 * o, atol=1e-7)
    agent.hard_update()
    for o, a in zip(online, [p for h in agent.model.target_heads() for p in h.parameters()]):
        assert torch.equal(o, a)


def test_learn_reduces_loss_and_leaves_targets_out_of_the_optimizer(walk_data):
    agent = ILQL(walk_data, TINY, lr=3e-3, alpha=0.1, seed=1)
    ids = {id(p) for g in agent.optimizer.param_groups for p in g["params"]}
    assert not any(id(p) in ids for h in agent.model.target_heads() for p in h.parameters())
    first = agent.learn()["loss"]
    for _ in range(30):
        last = agent.learn()["loss"]
    assert last < first


def test_checkpoint_round_trip_preserves_every_head(tmp_path, walk_data):
    agent = ILQL(walk_data, TINY, lr=1e-3, alpha=0.3, seed=2)
    for _ in range(3):
        agent.learn()
    agent.save_checkpoint(tmp_path / "ckpt")
    assert not list(tmp_path.glob("**/*.pt")) and not list(tmp_path.glob("**/*.pkl"))
    other = ILQL(walk_data, TINY, seed=99)
    other.load_checkpoint(tmp_path / "ckpt")
    sd_a, sd_b = agent.model.state_dict(), other.model.state_dict()
    assert set(sd_a) == set(sd_b)
    for name in ("q1.0.weight", "q2.2.bias", "target_q1.0.weight", "target_q2.2.weight", "v.0.weight", "gpt.lm_head.weight"):
        assert torch.equal(sd_a[name], sd_b[name]), name
    for name in sd_a:
        assert torch.equal(sd_a[name], sd_b[name]), name
    # the two Q heads differ from each other (no head saved under the other's key)
    assert not torch.equal(sd_b["q1.0.weight"], sd_b["q2.0.weight"])
    # and training continues identically (optimizer + RNG restored)
    assert agent.learn() == other.learn()


def test_clone_is_independent_and_carries_optimizer(walk_data):
    agent = ILQL(walk_data, TINY, lr=1e-3, seed=3)
    agent.learn()
    twin = agent.clone(index=7)
    assert twin.index == 7 and len(twin.optimizer.state) == len(agent.optimizer.state)
    assert agent.learn() == twin.learn()
    next(twin.model.parameters()).data.add_(1.0)
    assert not torch.equal(next(agent.model.parameters()), next(twin.model.parameters()))


@pytest.mark.parametrize("activation", ["GELU", "ReLU", "Tanh", "PReLU"])
def test_add_layer_leaves_outputs_bit_for_bit_unchanged(walk_data, activation):
    agent = ILQL(walk_data, {**TINY, "activation": activation}, lr=1e-3, seed=4)
    agent.learn()
    batch = _batch(walk_data)
    before = _outputs(agent.model, batch)
    change = agent.model.add_layer(1, generator=torch.Generator().manual_seed(0))
    remap_optimizer(agent.optimizer, change)
    assert agent.model.n_layer == 3 and agent.net_config["n_layer"] == 3
    for a, b in zip(before, _outputs(agent.model, batch)):
        assert torch.equal(a, b)
    agent.learn()  # the new block trains


@pytest.mark.parametrize("activation", ["GELU", "ReLU", "Tanh", "PReLU"])
def test_widen_ff_leaves_outputs_bit_for_bit_unchanged(walk_data, activation):
    agent = ILQL(walk_data, {**TINY, "activation": activation}, lr=1e-3, seed=5)
    agent.learn()
    batch = _batch(walk_data)
    before = _outputs(agent.model, batch)
    old = agent.model.gpt.transformer.h[0].mlp.c_fc.weight
    moment = agent.optimizer.state[old]["exp_avg"].clone()
    change = agent.model.widen_ff(16, generator=torch.Generator().manual_seed(0))
    remap_optimizer(agent.optimizer, change)
    new = agent.model.gpt.transformer.h[0].mlp.c_fc.weight
    assert new.shape == (32, 80) and agent.net_config["dim_feedfwd"] == 80
    assert torch.equal(agent.optimizer.state[new]["exp_avg"][:, :64], moment)
    for a, b in zip(before, _outputs(agent.model, batch)):
        assert torch.equal(a, b)
    agent.learn()


def test_remove_layer_and_activation_swap(walk_data):
    agent = ILQL(walk_data, {**TINY, "n_layer": 3}, lr=1e-3, seed=6)
    _, change = agent.model.remove_layer()
    remap_optimizer(agent.optimizer, change)
    assert agent.model.n_layer == 2
    change = agent.model.set_activation("ELU")
    remap_optimizer(agent.optimizer, change)
    assert all(isinstance(b.mlp.act, torch.nn.ELU) for b in agent.model.gpt.transformer.h)
    agent.learn()


def test_decoding_with_beta_zero_is_the_policy(walk_data):
    agent = ILQL(walk_data, TINY, seed=7)
    for _ in range(3):
        agent.learn()
    tokens = torch.tensor([[3, 5], [2, 9]])
    agent.model.eval()
    probs = next_token_distribution(agent.model, tokens, beta=0.0)
    with torch.no_grad():
        logits = agent.model.gpt(input_ids=tokens).logits[:, -1]
    assert torch.allclose(probs, torch.softmax(logits, -1), atol=1e-6)
    # β > 0 shifts by β (min Qt − V)
    out = agent.model.step_outputs(tokens)
    scores = ilql_scores(out["logits"], out["target_q"], out["v"], 2.0)
    expected = torch.log_softmax(logits, -1) + 2.0 * (out["target_q"] - out["v"][:, None])
    assert torch.allclose(scores, expected, atol=1e-6)
    greedy = next_token_distribution(agent.model, tokens, beta=2.0, top_k=1)
    assert torch.equal(greedy.argmax(-1), expected.argmax(-1)) and torch.allclose(greedy.sum(-1), torch.ones(2))


def test_malformed_datasets_are_refused(walk_data):
    bad = {k: v.copy() for k, v in walk_data.items()}
    bad["action_idxs"][0, 0] = 50
    with pytest.raises(ValueError, match=r"dataset.action_idxs: expected positions in \[0, 8\].*found 50"):
        validate_dataset(bad)
    bad = {k: v.copy() for k, v in walk_data.items()}
    bad["rewards"] = bad["rewards"][:, :-1]
    with pytest.raises(ValueError, match=r"dataset.rewards: expected shape"):
        ILQL(bad, TINY)
    bad = {k: v.copy() for k, v in walk_data.items()}
    bad["state_idxs"][3, 1] = -1
    with pytest.raises(ValueError, match="dataset.state_idxs"):
        validate_dataset(bad)
    with pytest.raises(ValueError, match="dataset.tokens: expected ids in"):
        validate_dataset(walk_data, vocab_size=5)
    with pytest.raises(ValueError, match="rewards: expected one per action"):
        episodes_to_arrays([Episode(tokens=[1, 2, 3], action_idxs=[0, 1], rewards=[1.0])], 4, 3)
    with pytest.raises(ValueError, match="beyond its"):
        episodes_to_arrays([Episode(tokens=[1, 2], action_idxs=[0, 1], rewards=[0.0, 1.0])], 4, 3)


def test_bad_net_config_is_refused():
    with pytest.raises(ValueError, match="arch.n_head: expected a divisor"):
        ILQLModel({**TINY, "n_head": 3})
    with pytest.raises(ValueError, match="activation: expected one of"):
        ILQLModel({**TINY, "activation": "Swoosh"})
    with pytest.raises(ValueError, match="arch.colour: unknown key"):
        ILQLModel({**TINY, "colour": 1})
