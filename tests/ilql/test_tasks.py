"""The tasks: randomwalks facts (trlx's graph and scores) and Wordle mechanics and data."""

import pytest
import torch

from agents.ilql.data import episodes_to_arrays
from agents.ilql.tasks.wordle import Wordle, feedback


def test_randomwalks_matches_the_reference_setup(walks):
    assert walks.adj.shape == (21, 21) and walks.adj[0].sum() == 1 and walks.adj[0, 0]
    assert len(walks.walks) == 1000 and all(len(w) <= 10 for w in walks.walks)
    assert walks.data_optimality() == pytest.approx(0.35, abs=0.02)  # uniform walks score ~0.35
    start = 1
    assert walks.optimality([start, 99]) == 0.0          # missing node: invalid path
    assert walks.optimality([start]) == 0.0              # never reaches the goal


def test_randomwalks_episode_layout(walks, walk_data):
    walk = walks.walks[0]
    assert list(walk_data["tokens"][0, : len(walk)]) == [n + 1 for n in walk]
    n_actions = len(walk) - 1
    assert walk_data["action_mask"][0].sum() == n_actions
    assert walk_data["rewards"][0, n_actions - 1] == pytest.approx(walks.optimality(walk))
    assert walk_data["terminals"][0, n_actions] and not walk_data["terminals"][0, :n_actions].any()


def test_wordle_feedback_handles_repeated_letters():
    assert feedback("apple", "apple") == (2, 2, 2, 2, 2)
    assert feedback("allee", "apple") == (2, 1, 0, 0, 2)   # only one extra 'l' in the answer
    assert feedback("crane", "about") == (0, 0, 1, 0, 0)


@pytest.fixture(scope="module")
def wordle():
    return Wordle(n_games=200, n_words=32, seed=1)


def test_wordle_expert_is_strong_and_data_is_suboptimal(wordle):
    expert = wordle.expert_stats()
    assert expert["win_rate"] == 1.0 and expert["mean_return"] > -3.5
    data = wordle.data_stats()
    assert data["mean_return"] < expert["mean_return"]


def test_wordle_episodes_are_valid_per_token_mdps(wordle):
    eps = wordle.episodes()
    arrays = episodes_to_arrays(eps, wordle.max_tokens, wordle.max_actions)
    answer, guesses = wordle.games[0]
    tokens = eps[0].tokens
    assert len(tokens) == 1 + 10 * len(guesses)
    assert sum(eps[0].rewards) == -len(guesses)
    actions = [tokens[p + 1] for p in eps[0].action_idxs]
    assert wordle.tokenizer.decode(actions) == "".join(wordle.words[g] for g in guesses)
    assert arrays["tokens"].max() < wordle.vocab_size


class _ScriptedSpeller(torch.nn.Module):
    """A stand-in policy that spells `words[g]` as its g-th guess (greedy through the real decoder)."""

    def __init__(self, wordle, guesses: list[str]) -> None:
        super().__init__()
        self.wordle, self.guesses = wordle, guesses

    def step_outputs(self, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        guess, letter = divmod(tokens.shape[1] - 1, 10)  # a start token, then 5 letters + 5 feedback per guess
        logits = torch.zeros(tokens.shape[0], self.wordle.vocab_size)
        logits[:, self.wordle.tokenizer.token_to_id(self.guesses[guess][letter])] = 1.0
        zeros = torch.zeros(tokens.shape[0])
        return {"logits": logits, "target_q": torch.zeros_like(logits), "v": zeros}


def test_wordle_evaluate_plays_every_answer_and_scores_each_game(wordle):
    """Guessing words 0..5 in turn wins game j (answer = word j) in j + 1 guesses and loses every other
    game (-6): the means follow only if every answer is played once per sample and scored by the rules."""
    n = len(wordle.words)
    policy = _ScriptedSpeller(wordle, wordle.words[:6])
    out = wordle.evaluate(policy, beta=0.0, samples=2, top_k=1, generator=torch.Generator().manual_seed(0))
    assert out["win_rate"] == pytest.approx(6 / n)
    assert out["mean_return"] == pytest.approx((-sum(range(1, 7)) - 6 * (n - 6)) / n)
