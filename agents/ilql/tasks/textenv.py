"""Text environments: how members of a `jsonl` task are evaluated by acting.

A text environment is any class named as `task.env = "package.module:Class"` and built with
`Class(**task.env_kwargs)`:

    class MyEnv:
        def reset(self, seed: int) -> str: ...                        # the first environment text
        def step(self, action: str) -> tuple[str, float, bool]: ...   # environment text, reward, done
        # optional
        max_action_tokens: int = 32        # an action ends after this many tokens …
        def action_done(self, action: str) -> bool: ...               # … or as soon as this says so
        action_chars: str | None = None    # decode actions only from tokens made of these characters
        max_turns: int = 64                # a cap on actions per episode

The same segments the JSONL file holds are produced live: environment text is encoded and
appended, the member decodes an action token by token (log π + β (min Qt − V)), the decoded text
goes to `step`. Episodes that outgrow the model's positions end there (truncated).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from agents.ilql.tokenizer import TextTokenizer

__all__ = ["env_factory", "play"]

_ALLOWED: dict[tuple[int, str], torch.Tensor] = {}


def env_factory(spec: str, kwargs: dict[str, Any]) -> Callable[[], Any]:
    """`package.module:Class` → a zero-argument constructor; checks the class can be built and has reset/step."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"task.env: expected 'package.module:Class', found {spec!r}")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"task.env: cannot import {spec!r} ({exc})") from None
    try:
        probe = cls(**kwargs)
    except TypeError as exc:
        raise ValueError(f"task.env_kwargs: {spec} rejects {sorted(kwargs)} ({exc})") from None
    missing = [m for m in ("reset", "step") if not callable(getattr(probe, m, None))]
    if missing:
        raise ValueError(f"task.env: {spec} has no {missing[0]}() method (a text environment needs reset(seed) and step(action))")
    return lambda: cls(**kwargs)


def _allowed_tokens(tok: TextTokenizer, chars: str | None) -> torch.Tensor | None:
    """Tokens whose text is made only of `chars` (None: every token)."""
    if not chars:
        return None
    key = (id(tok.tok), chars)
    if key not in _ALLOWED:
        allowed = set(chars)
        mask = torch.zeros(tok.vocab_size, dtype=torch.bool)
        for i in range(tok.vocab_size):
            text = tok.decode([i])
            mask[i] = bool(text) and set(text) <= allowed
        _ALLOWED[key] = mask
    return _ALLOWED[key]


@torch.no_grad()
def play(model, tok: TextTokenizer, make_env: Callable[[], Any], seeds: list[int], beta: float,
         temperature: float = 1.0, top_k: int = 0, generator: torch.Generator | None = None,
         max_tokens: int = 1024) -> dict[str, float]:
    """One episode per seed, decoded in batches of equal length; mean return, length and truncations."""
    from agents.ilql.decode import next_token_distribution

    was_training = model.training
    model.eval()
    envs = [make_env() for _ in seeds]
    probe = envs[0]
    max_action = int(getattr(probe, "max_action_tokens", 32))
    max_turns = int(getattr(probe, "max_turns", 64))
    allowed = _allowed_tokens(tok, getattr(probe, "action_chars", None))
    seqs = [[tok.bos_id] + tok.encode(env.reset(seed)) for env, seed in zip(envs, seeds)]
    returns = np.zeros(len(envs))
    turns = np.zeros(len(envs), np.int64)
    truncated = np.zeros(len(envs), bool)
    active = [i for i, s in enumerate(seqs) if len(s) < max_tokens]
    truncated[[i for i in range(len(seqs)) if i not in active]] = True
    for _ in range(max_turns):
        if not active:
            break
        actions: dict[int, list[int]] = {i: [] for i in active}
        decoding = list(active)
        for _ in range(max_action):
            if not decoding:
                break
            by_len: dict[int, list[int]] = {}
            for i in decoding:
                by_len.setdefault(len(seqs[i]), []).append(i)
            finished = set()
            for length in sorted(by_len):
                rows = by_len[length]
                tokens = torch.tensor([seqs[i] for i in rows], dtype=torch.long)
                mask = None if allowed is None else allowed.expand(len(rows), -1)
                probs = next_token_distribution(model, tokens, beta, temperature, top_k, mask)
                nxt = torch.multinomial(probs, 1, generator=generator)[:, 0].tolist()
                for i, t in zip(rows, nxt):
                    seqs[i].append(t)
                    actions[i].append(t)
                    done_fn = getattr(envs[i], "action_done", None)
                    if len(seqs[i]) >= max_tokens or (done_fn is not None and done_fn(tok.decode(actions[i]))):
                        finished.add(i)
            decoding = [i for i in decoding if i not in finished]
        still = []
        for i in active:
            text, reward, done = envs[i].step(tok.decode(actions[i]))
            returns[i] += float(reward)
            turns[i] += 1
            if not done:
                seqs[i].extend(tok.encode(text))
                if len(seqs[i]) >= max_tokens:
                    truncated[i] = True
                else:
                    still.append(i)
        active = still
    truncated[active] = True
    model.train(was_training)
    return {"mean_return": float(returns.mean()), "mean_turns": float(turns.mean()),
            "truncated": float(truncated.mean())}
