"""Gumbel MuZero root search (agents.efficientzero.mcts, `search = "gumbel"`)."""

import numpy as np
import pytest
import torch

from agents.efficientzero.mcts import BatchedMCTS, MCTSConfig, considered_visits, search
from agents.efficientzero.selfplay import chosen_actions
from agents.efficientzero.support import scalar_to_support
from evo.checkpoint import load_state, save_state
from evo.hparams import HParam, mutate_hparams
from tests.efficientzero.test_agent import make


class FourArms:
    """A hand-made model with 4 actions: action `good` earns reward 1, the others 0. The value head
    predicts 0 and the prior *prefers a bad action* (logits favour action 0), so only search can
    move probability toward `good`."""

    action_space_size = 4
    value_support = 10
    reward_support = 10
    support_step = 1.0

    def __init__(self, good: int = 2, logits=(1.0, 0.5, 0.0, 0.0)) -> None:
        self.good = good
        self.logits = torch.tensor(logits)

    def represent(self, obs):
        return torch.as_tensor(obs, dtype=torch.float32)

    def predict(self, latent):
        B = latent.shape[0]
        return self.logits.expand(B, 4).clone(), torch.log(scalar_to_support(torch.zeros(B), self.value_support) + 1e-12)

    def initial_hidden(self, batch):
        return torch.zeros(batch, 1), torch.zeros(batch, 1)

    def dynamics(self, latent, action, hidden):
        reward = (action == self.good).float()
        prefix = hidden[0][:, 0] + reward
        logits = torch.log(scalar_to_support(prefix, self.reward_support) + 1e-12)
        return latent, (prefix[:, None], hidden[1]), logits


def prior_of(model: FourArms) -> np.ndarray:
    return torch.softmax(model.logits, 0).numpy()


@pytest.mark.parametrize("sims", [2, 3, 4])
def test_improved_policy_moves_mass_to_the_best_action_with_few_simulations(sims):
    """With 2-4 simulations and Gumbel noise, whenever the good action is among those visited, the
    policy target puts more mass on it than the prior did; averaged over noise draws it always does."""
    model = FourArms(good=2)
    cfg = MCTSConfig(num_simulations=sims, discount=0.9, search="gumbel", max_considered_actions=4)
    res = BatchedMCTS(cfg).run(model, torch.zeros(64, 1), np.random.default_rng(0), add_noise=True)
    p = prior_of(model)
    visited = res.visit_counts[:, 2] > 0
    assert visited.any()
    assert (res.policy[visited, 2] > 0.8).all()  # the visit share is at most 1/2 with 2-4 simulations
    assert res.policy[:, 2].mean() > p[2]
    assert np.allclose(res.policy.sum(1), 1.0)
    assert res.visit_counts.sum(1).tolist() == [sims] * 64
    # the action played is mostly the good one when search saw it (the only positive Q, +5 logits; the
    # Gumbel noise still makes it a sample: an equally-visited rival wins when its noise is 5 higher)
    assert (res.action[visited] == 2).mean() > 0.9


def test_greedy_gumbel_finds_the_good_action_the_prior_disfavours():
    """No noise (evaluation): the top-4 considered actions by logit are all four, so with 8 simulations
    the good one is visited and chosen, although PUCT's argmax of 8 visits does not choose it."""
    model = FourArms(good=3)
    gum = BatchedMCTS(MCTSConfig(num_simulations=8, discount=0.9, search="gumbel", max_considered_actions=4))
    res = gum.run(model, torch.zeros(3, 1))
    assert res.action.tolist() == [3, 3, 3]
    assert (res.policy.argmax(1) == 3).all()
    assert chosen_actions(res, 0.0, None).tolist() == [3, 3, 3]
    puct = BatchedMCTS(MCTSConfig(num_simulations=8, discount=0.9)).run(model, torch.zeros(3, 1))
    assert puct.action is None


def test_considered_visits_is_mctx_sequential_halving():
    assert considered_visits(4, 8) == (0, 0, 0, 0, 1, 1, 2, 2)
    assert considered_visits(2, 5) == (0, 0, 1, 1, 2)
    assert considered_visits(1, 3) == (0, 1, 2)
    assert considered_visits(16, 4) == (0, 0, 0, 0)
    seq = considered_visits(16, 50)
    assert len(seq) == 50 and seq[:16] == (0,) * 16


def test_sequential_halving_visit_counts():
    """8 simulations over 4 considered actions: one visit each, then the better two get two more
    each: the root visits are {3, 3, 1, 1} and the good action is among the survivors."""
    model = FourArms(good=1)
    cfg = MCTSConfig(num_simulations=8, discount=0.9, search="gumbel", max_considered_actions=4)
    res = BatchedMCTS(cfg).run(model, torch.zeros(16, 1), np.random.default_rng(1), add_noise=True)
    for row in res.visit_counts:
        assert sorted(row.tolist()) == [1, 1, 3, 3]
    assert (res.visit_counts[:, 1] == 3).all()
    # two considered of four: only the top-2 by noise + logit are ever visited
    cfg2 = MCTSConfig(num_simulations=6, discount=0.9, search="gumbel", max_considered_actions=2)
    res2 = BatchedMCTS(cfg2).run(model, torch.zeros(16, 1), np.random.default_rng(1), add_noise=True)
    assert ((res2.visit_counts > 0).sum(1) == 2).all() and (res2.visit_counts.sum(1) == 6).all()


def test_gumbel_and_puct_roots_mix_in_one_batch_without_leaking():
    """One `search` call with a per-root kind gives each root what a solo search of its kind gives."""
    model = FourArms(good=2)
    obs = torch.zeros(4, 1)
    kinds = np.array([True, False, True, False])
    mixed = search(model, obs, np.full(4, 0.9), np.full(4, 8), 5, gumbel=kinds,
                   max_considered_actions=np.full(4, 4))
    gum = BatchedMCTS(MCTSConfig(num_simulations=8, discount=0.9, search="gumbel", max_considered_actions=4)).run(model, obs[:1])
    puct = BatchedMCTS(MCTSConfig(num_simulations=8, discount=0.9)).run(model, obs[:1])
    for b in range(4):
        solo = gum if kinds[b] else puct
        assert np.array_equal(mixed.visit_counts[b], solo.visit_counts[0])
        assert np.allclose(mixed.policy[b], solo.policy[0])
    assert mixed.action.tolist()[1::2] == [-1, -1]


def test_search_choice_mutates_and_round_trips_through_a_checkpoint(tmp_path):
    space = {"search": HParam("gumbel", kind="choice", choices=("puct", "gumbel"))}
    changes = mutate_hparams(space, {"search": "gumbel"}, np.random.default_rng(0))
    assert changes == {"search": ("gumbel", "puct")}
    # the agent's own default is fixed (one choice): it never takes a mutation's draw
    assert not HParam("puct", kind="choice", choices=("puct",)).mutable
    a = make(hp={"search": "gumbel", "max_considered_actions": 2})
    a.train(40)
    save_state(tmp_path / "m", a.get_state())
    b = type(a).from_state(load_state(tmp_path / "m")[0], a.context)
    assert b.hparams["search"] == "gumbel" and b.hparams["max_considered_actions"] == 2
    assert a.train(20)["env_steps"] == b.train(20)["env_steps"]
    assert a.evaluate().fitness == b.evaluate().fitness
    with pytest.raises(ValueError, match="hparams.search"):
        make(hp={"search": "alphazero"})
