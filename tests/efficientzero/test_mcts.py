import numpy as np
import pytest
import torch

from agents.efficientzero.mcts import BatchedMCTS, MCTSConfig, select_actions
from agents.efficientzero.support import scalar_to_support


class HandModel:
    """A hand-made model: the latent is the observation; the LSTM state carries the value prefix.

    Action `good[b]` (obs[b, 0] > 0 -> action 1, else action 0) earns reward 1, the other 0;
    the value head predicts 0 and the policy is uniform, so only search can find the good action.
    """

    action_space_size = 2
    value_support = 10
    reward_support = 10
    support_step = 1.0

    def represent(self, obs):
        return torch.as_tensor(obs, dtype=torch.float32)

    def predict(self, latent):
        B = latent.shape[0]
        return torch.zeros(B, 2), torch.log(scalar_to_support(torch.zeros(B), self.value_support) + 1e-12)

    def initial_hidden(self, batch):
        return torch.zeros(batch, 1), torch.zeros(batch, 1)

    def dynamics(self, latent, action, hidden):
        good = (latent[:, 0] > 0).long()
        reward = (action == good).float()
        prefix = hidden[0][:, 0] + reward
        logits = torch.log(scalar_to_support(prefix, self.reward_support) + 1e-12)
        return latent, (prefix[:, None], hidden[1]), logits


class FineHandModel(HandModel):
    """HandModel's values and rewards on bins a quarter as wide (`support_step` 0.25, the same range)."""

    value_support = 40
    reward_support = 40
    support_step = 0.25

    def predict(self, latent):
        B = latent.shape[0]
        return torch.zeros(B, 2), torch.log(scalar_to_support(torch.full((B,), 0.5), 40, 0.25) + 1e-12)

    def dynamics(self, latent, action, hidden):
        latent, hidden, _ = super().dynamics(latent, action, hidden)
        return latent, hidden, torch.log(scalar_to_support(hidden[0][:, 0], 40, 0.25) + 1e-12)


def test_search_decodes_values_and_rewards_at_the_models_support_step():
    """The same values and rewards on step-1 and step-0.25 supports give the same search; read with a step
    of 1, the fine model's predicted 0.5 would count as about 3.6 and its rewards likewise."""
    class CoarseHandModel(HandModel):
        def predict(self, latent):
            B = latent.shape[0]
            return torch.zeros(B, 2), torch.log(scalar_to_support(torch.full((B,), 0.5), 10) + 1e-12)

    mcts = BatchedMCTS(MCTSConfig(num_simulations=20, discount=0.9, lstm_horizon_len=5))
    obs = torch.tensor([[1.0], [-1.0]])
    coarse, fine = mcts.run(CoarseHandModel(), obs), mcts.run(FineHandModel(), obs)
    assert coarse.visit_counts.tolist() == fine.visit_counts.tolist()
    np.testing.assert_allclose(fine.root_values, coarse.root_values, atol=1e-5)
    assert 1.0 < fine.root_values.min() and fine.root_values.max() < 10


@pytest.mark.parametrize("horizon", [1, 2, 5])
def test_picks_the_obviously_best_action(horizon):
    mcts = BatchedMCTS(MCTSConfig(num_simulations=30, discount=0.9, lstm_horizon_len=horizon))
    obs = torch.tensor([[1.0], [-1.0], [2.0]])
    res = mcts.run(HandModel(), obs)
    assert res.visit_counts.sum(1).tolist() == [30, 30, 30]
    assert select_actions(res.visit_counts, 0.0, None).tolist() == [1, 0, 1]
    assert (res.visit_counts.max(1) >= 20).all()
    # the good action always pays 1: root value approaches sum_k 0.9^k
    assert (res.root_values > 1.0).all()


def test_visit_counts_sum_to_simulations_with_noise():
    mcts = BatchedMCTS(MCTSConfig(num_simulations=17))
    res = mcts.run(HandModel(), torch.randn(6, 1), np.random.default_rng(0), add_noise=True)
    assert res.visit_counts.sum(1).tolist() == [17] * 6
    assert np.allclose(res.policy.sum(1), 1.0)
    assert np.allclose(res.root_prior.sum(1), 1.0) and not np.allclose(res.root_prior, 0.5)


def test_deterministic_under_a_seed():
    mcts = BatchedMCTS(MCTSConfig(num_simulations=12))
    obs = torch.randn(8, 1, generator=torch.Generator().manual_seed(3))

    def run(seed):
        rng = np.random.default_rng(seed)
        res = mcts.run(HandModel(), obs, rng, add_noise=True)
        return res.visit_counts, select_actions(res.visit_counts, 1.0, rng)

    (c1, a1), (c2, a2) = run(5), run(5)
    assert np.array_equal(c1, c2) and np.array_equal(a1, a2)
    c3, _ = run(6)
    assert not np.array_equal(c1, c3)


def test_batch_entries_are_independent():
    """Each root's statistics equal those of a solo search of that root (no leak across entries)."""
    mcts = BatchedMCTS(MCTSConfig(num_simulations=20, discount=0.95))
    obs = torch.tensor([[1.0], [-1.0], [0.5], [-3.0]])
    batch = mcts.run(HandModel(), obs)
    for b in range(len(obs)):
        solo = mcts.run(HandModel(), obs[b : b + 1])
        assert np.array_equal(batch.visit_counts[b], solo.visit_counts[0])
        assert np.isclose(batch.root_values[b], solo.root_values[0])


def test_search_with_a_real_model_and_temperature():
    from agents.efficientzero.agent import EfficientZeroAgent
    from agents.efficientzero.model import build_model

    arch = EfficientZeroAgent.validate_arch({})
    model = build_model((4,), 2, arch, torch.Generator().manual_seed(0))
    res = BatchedMCTS(MCTSConfig(num_simulations=8)).run(model, torch.randn(5, 4), np.random.default_rng(0), True)
    assert res.visit_counts.shape == (5, 2) and res.visit_counts.sum() == 40
    actions = select_actions(res.visit_counts, 0.5, np.random.default_rng(1))
    assert set(actions.tolist()) <= {0, 1}
    with pytest.raises(ValueError, match="numpy Generator"):
        BatchedMCTS(MCTSConfig()).run(model, torch.randn(2, 4), None, add_noise=True)
