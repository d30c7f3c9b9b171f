"""Wordle with a small word list: character tokens, an exact information-gain expert, and the
suboptimal-data recipe of Snell et al. (ILQL paper, §5): data from a mixture of policies.

A game is a token sequence

    ">" g1 g1 g1 g1 g1 f1 f1 f1 f1 f1 g2 … f_k

where g are the five letters of a guess (the agent's actions) and f the five feedback characters
("0" grey, "1" yellow, "2" green) written by the environment (transition tokens). Reward −1 per
guess; the game ends when the word is found or after 6 guesses, so a return is −1 … −6 and a
loss scores −6.

Data policies (fractions configurable):
* expert   : the guess that maximises the exact information gain (entropy of the feedback
             partition of the words still consistent); the last candidate when one is left;
* mixture  : each turn the expert with probability `mixture_p`, else a uniformly random word;
* repeat   : each turn, with probability `bad_p`, a repeated earlier guess or a word that the
             feedback already rules out; otherwise the expert.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from agents.ilql.data import Episode
from agents.ilql.tokenizer import build_char_tokenizer

__all__ = ["Wordle", "WordleTextEnv", "WORDS", "WORDLE_DEFAULTS", "feedback", "write_jsonl"]

WORDS = (
    "about above actor adult after again agent alarm album alert alike alive allow alone among angel "
    "anger apple arena argue arise armor array aside audio avoid award aware basic beach begin black "
    "blade blame blind block blood board brain brand bread break brick brief bring broad brown build "
    "cabin candy chain chair chart cheap check chest chief child claim class clean clear climb clock "
    "cloud coach coast count court cover craft crash cream crime cross crowd dance death dream drink"
).split()

WORDLE_DEFAULTS = {"n_games": 2000, "n_words": 64, "seed": 0, "expert_frac": 0.2, "mixture_frac": 0.4,
                   "mixture_p": 0.3, "bad_p": 0.7, "max_guesses": 6}

FEEDBACK_CHARS = "012"
START = ">"


def feedback(guess: str, answer: str) -> tuple[int, ...]:
    """Wordle colours per letter: 2 green, 1 yellow, 0 grey (repeated letters handled as in the game)."""
    out = [0] * 5
    left: dict[str, int] = {}
    for i, (g, a) in enumerate(zip(guess, answer)):
        if g == a:
            out[i] = 2
        else:
            left[a] = left.get(a, 0) + 1
    for i, g in enumerate(guess):
        if out[i] == 0 and left.get(g, 0) > 0:
            out[i] = 1
            left[g] -= 1
    return tuple(out)


@dataclass
class Wordle:
    n_games: int = 2000
    n_words: int = 64
    seed: int = 0
    expert_frac: float = 0.2
    mixture_frac: float = 0.4
    mixture_p: float = 0.3
    bad_p: float = 0.7
    max_guesses: int = 6

    fitness_metric = "mean_return"

    def __post_init__(self) -> None:
        if not 2 <= self.n_words <= len(WORDS):
            raise ValueError(f"task.n_words: expected within [2, {len(WORDS)}], found {self.n_words}")
        if self.expert_frac + self.mixture_frac > 1:
            raise ValueError("task.expert_frac + task.mixture_frac: expected at most 1")
        self.words = WORDS[: self.n_words]
        letters = sorted(set("".join(self.words)))
        self.tokenizer = build_char_tokenizer([START] + list(FEEDBACK_CHARS) + letters)
        self.vocab_size = self.tokenizer.get_vocab_size()
        self.letter_ids = torch.tensor([self.tokenizer.token_to_id(c) for c in letters])
        # codes[g, a]: feedback of guess g against answer a, as an integer in [0, 243)
        self.codes = np.array([[_code(feedback(g, a)) for a in self.words] for g in self.words], dtype=np.int64)
        self._first = self._expert_guess(np.ones(len(self.words), bool))
        rng = np.random.default_rng(self.seed)
        self.games = [self._play_data_game(rng) for _ in range(self.n_games)]

    # ---- game mechanics -------------------------------------------------------------------------
    @property
    def max_tokens(self) -> int:
        return 1 + 10 * self.max_guesses

    @property
    def max_actions(self) -> int:
        return 5 * self.max_guesses

    def _expert_guess(self, consistent: np.ndarray) -> int:
        """Index of the guess with the highest exact information gain over the consistent answers."""
        cand = np.nonzero(consistent)[0]
        if len(cand) <= 2:
            return int(cand[0])
        n = len(self.words)
        counts = np.bincount((self.codes[:, cand] + 243 * np.arange(n)[:, None]).ravel(), minlength=243 * n)
        p = counts.reshape(n, 243) / len(cand)
        h = -(p * np.log2(np.where(p > 0, p, 1.0))).sum(1) + 1e-6 * consistent  # ties: prefer possible answers
        return int(np.argmax(h))

    def _play_data_game(self, rng: np.random.Generator) -> tuple[int, list[int]]:
        answer = int(rng.integers(len(self.words)))
        u = rng.random()
        policy = "expert" if u < self.expert_frac else "mixture" if u < self.expert_frac + self.mixture_frac else "repeat"
        consistent = np.ones(len(self.words), bool)
        guesses: list[int] = []
        for turn in range(self.max_guesses):
            expert = self._first if turn == 0 else self._expert_guess(consistent)
            guess = expert
            if policy == "mixture" and rng.random() >= self.mixture_p:
                guess = int(rng.integers(len(self.words)))
            elif policy == "repeat" and turn > 0 and rng.random() < self.bad_p:
                ruled_out = np.nonzero(~consistent)[0]
                if rng.random() < 0.5 or len(ruled_out) == 0:
                    guess = int(rng.choice(guesses))
                else:
                    guess = int(rng.choice(ruled_out))
            guesses.append(guess)
            if guess == answer:
                break
            consistent &= self.codes[guess] == self.codes[guess, answer]
        return answer, guesses

    def encode_game(self, answer: int, guesses: list[int]) -> Episode:
        text = START
        for g in guesses:
            text += self.words[g] + "".join(map(str, feedback(self.words[g], self.words[answer])))
        tokens = self.tokenizer.encode(text).ids
        action_idxs = [1 + 10 * t + i - 1 for t in range(len(guesses)) for i in range(5)]
        rewards = [(-1.0 if i == 4 else 0.0) for _ in guesses for i in range(5)]
        return Episode(tokens=tokens, action_idxs=action_idxs, rewards=rewards)

    def episodes(self) -> list[Episode]:
        return [self.encode_game(a, g) for a, g in self.games]

    def game_record(self, answer: int, guesses: list[int]) -> dict:
        """One game as a `task = "jsonl"` record: ">" then each guess (reward −1) and its feedback."""
        segments: list[dict] = [{"role": "env", "text": START}]
        for g in guesses:
            segments.append({"role": "agent", "text": self.words[g], "reward": -1.0})
            segments.append({"role": "env", "text": "".join(map(str, feedback(self.words[g], self.words[answer])))})
        return {"segments": segments, "terminal": True}

    def data_stats(self) -> dict[str, float]:
        returns = [-len(g) if self.words[g[-1]] == self.words[a] else -self.max_guesses for a, g in self.games]
        wins = [g[-1] == a for a, g in self.games]
        return {"mean_return": float(np.mean(returns)), "win_rate": float(np.mean(wins))}

    def expert_stats(self) -> dict[str, float]:
        """The expert's return and win rate over every answer in the list."""
        returns, wins = [], []
        for answer in range(len(self.words)):
            consistent = np.ones(len(self.words), bool)
            for turn in range(self.max_guesses):
                g = self._first if turn == 0 else self._expert_guess(consistent)
                if g == answer:
                    break
                consistent &= self.codes[g] == self.codes[g, answer]
            wins.append(g == answer)
            returns.append(-(turn + 1) if g == answer else -self.max_guesses)
        return {"mean_return": float(np.mean(returns)), "win_rate": float(np.mean(wins))}

    # ---- evaluation -----------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, model, beta: float, samples: int = 1, temperature: float = 1.0, top_k: int = 0,
                 generator: torch.Generator | None = None) -> dict[str, float]:
        """Play every word of the list as the answer (`samples` times each) with ILQL decoding."""
        from agents.ilql.decode import next_token_distribution

        was_training = model.training
        model.eval()
        answers = [a for a in range(len(self.words)) for _ in range(samples)]
        n = len(answers)
        tokens = torch.full((n, 1), self.tokenizer.token_to_id(START), dtype=torch.long)
        allowed = torch.zeros(n, self.vocab_size, dtype=torch.bool)
        allowed[:, self.letter_ids] = True
        done = np.zeros(n, bool)
        guesses_used = np.zeros(n, np.int64)
        won = np.zeros(n, bool)
        fb_ids = {c: self.tokenizer.token_to_id(c) for c in FEEDBACK_CHARS}
        for _ in range(self.max_guesses):
            for _ in range(5):
                probs = next_token_distribution(model, tokens, beta, temperature, top_k, allowed)
                tokens = torch.cat([tokens, torch.multinomial(probs, 1, generator=generator)], dim=1)
            guess_text = [self.tokenizer.decode(row[-5:].tolist()) for row in tokens]
            fb_rows = []
            for i, guess in enumerate(guess_text):
                fb = feedback(guess, self.words[answers[i]])
                fb_rows.append([fb_ids[str(c)] for c in fb])
                if not done[i]:
                    guesses_used[i] += 1
                    if guess == self.words[answers[i]]:
                        won[i] = done[i] = True
            tokens = torch.cat([tokens, torch.tensor(fb_rows, dtype=torch.long)], dim=1)
            if done.all():
                break
        model.train(was_training)
        returns = np.where(won, -guesses_used, -self.max_guesses)
        return {"mean_return": float(returns.mean()), "win_rate": float(won.mean())}


class WordleTextEnv:
    """Wordle as a text environment (agents.ilql.tasks.textenv) for `task = "jsonl"` evaluation:
    `reset(seed)` picks answer word `seed mod n_words` and shows ">", each five-letter guess is
    answered with its five feedback characters, reward −1 per guess, at most `max_guesses`."""

    max_action_tokens = 5

    def __init__(self, n_words: int = 64, max_guesses: int = 6) -> None:
        if not 2 <= n_words <= len(WORDS):
            raise ValueError(f"n_words: expected within [2, {len(WORDS)}], found {n_words}")
        self.words = WORDS[:n_words]
        self.action_chars = "".join(sorted(set("".join(self.words))))
        self.max_turns = max_guesses
        self.answer, self.turn = self.words[0], 0

    def action_done(self, action: str) -> bool:
        return len(action) >= 5

    def reset(self, seed: int) -> str:
        self.answer, self.turn = self.words[seed % len(self.words)], 0
        return START

    def step(self, action: str) -> tuple[str, float, bool]:
        guess = action[:5]
        self.turn += 1
        done = guess == self.answer or self.turn >= self.max_turns
        return "".join(map(str, feedback(guess, self.answer))), -1.0, done


def write_jsonl(path: str | Path, **settings) -> dict[str, float]:
    """Write the data games of `Wordle(**settings)` as a JSONL file, one game per line; returns their stats."""
    task = Wordle(**settings)
    with open(path, "w", encoding="utf-8") as f:
        for answer, guesses in task.games:
            f.write(json.dumps(task.game_record(answer, guesses), separators=(",", ":")) + "\n")
    return task.data_stats()


def _code(fb: tuple[int, ...]) -> int:
    code = 0
    for c in fb:
        code = code * 3 + c
    return code


if __name__ == "__main__":  # python -m agents.ilql.tasks.wordle OUT.jsonl [--n-games N] [--seed S]
    import argparse

    parser = argparse.ArgumentParser(description="Write the Wordle task's data games as a task = 'jsonl' file")
    parser.add_argument("out")
    parser.add_argument("--n-games", type=int, default=WORDLE_DEFAULTS["n_games"])
    parser.add_argument("--seed", type=int, default=WORDLE_DEFAULTS["seed"])
    args = parser.parse_args()
    print(json.dumps(write_jsonl(args.out, n_games=args.n_games, seed=args.seed)))
